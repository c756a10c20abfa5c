// Open a DAG's trigger dialog as a new user would, check it opens clean (no field in error, Trigger enabled),
// screenshot it, then trigger with the defaults (the "Unpause on trigger" box unticked, so the run stays queued).
// Args (besides lib.mjs's): dag_id, params (every param name: each must have its field), trigger (bool),
// settle_ms (how long a dialog with problems is given to clear them).
import { args, dialogProblems, openTriggerDialog, pollUntil, scenario, screenshotDialog } from './lib.mjs';

await scenario(`trigger-${args.dag_id}`, async (page) => {
  const dialog = await openTriggerDialog(page, args.dag_id, args.params);
  const clean = (p) => p.submit_enabled && p.fields.length === 0 && !p.alert;
  let problems = await dialogProblems(dialog);
  if (!clean(problems)) {
    await pollUntil(async () => clean((problems = await dialogProblems(dialog))), args.settle_ms ?? 15000);
  }
  const shot = await screenshotDialog(page, dialog, `trigger-dialog-${args.dag_id}.png`);
  const heading = (await dialog.getByRole('heading').first().innerText()).replace(/\s+/g, ' ').trim();
  const result = { heading, problems, clean: clean(problems), screenshot: shot };
  if (!args.trigger || !result.clean) return result;

  const unpause = dialog.getByRole('checkbox', { name: /^Unpause .* on trigger$/ });
  result.unpause_offered = (await unpause.count()) > 0;
  if (result.unpause_offered) {
    result.unpause_checked_by_default = await unpause.isChecked();
    if (result.unpause_checked_by_default) await dialog.getByText(/^Unpause .* on trigger$/).click();
    await pollUntil(async () => !(await unpause.isChecked()));
    result.unpause_checked_at_trigger = await unpause.isChecked();
  }
  const posted = page.waitForResponse((r) => r.request().method() === 'POST'
    && new URL(r.url()).pathname === `/api/v2/dags/${args.dag_id}/dagRuns`);
  await dialog.getByTestId('trigger-dag-submit').click();
  const response = await posted;
  result.status = response.status();
  result.sent = JSON.parse(response.request().postData() ?? 'null');
  result.answer = await response.json().catch(() => null);
  if (response.ok()) {
    await dialog.waitFor({ state: 'hidden' });
    result.url_after = page.url();
  }
  return result;
});
