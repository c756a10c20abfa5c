// Enter bad values into a DAG's trigger dialog, one case at a time (the page is reloaded between cases), and
// report how the form answers each: the field's value after it loses focus, the fields in error (with their
// messages), whether Trigger is enabled, and, for a case with submit=true, what the api-server answered and the
// alert the dialog then shows. A screenshot of the dialog per case.
// Args (besides lib.mjs's): dag_id, params (every param name), cases: [{param, value (typed as text), submit, shot}],
// settle_ms (how long the form is given to mark a field before the case counts as "nothing shown").
import { args, dialogProblems, openTriggerDialog, pollUntil, scenario, screenshotDialog } from './lib.mjs';

const UNPAUSE = /^Unpause .* on trigger$/;

async function tryCase(page, c) {
  const dialog = await openTriggerDialog(page, args.dag_id, args.params);
  const unpause = dialog.getByRole('checkbox', { name: UNPAUSE });
  if ((await unpause.count()) && (await unpause.isChecked())) {
    await dialog.getByText(UNPAUSE).click();  // a refused trigger must not unpause the DAG either
    await pollUntil(async () => !(await unpause.isChecked()));
  }
  const field = dialog.locator(`[name="element_${c.param}"]`);
  await field.fill(String(c.value));
  await field.press('Tab');  // leave the field, as a user moving on would
  // The form answers on blur or on change: a number field clamps its value (the clamp may land a frame after the
  // Tab), a field is marked, or Trigger is disabled. Wait for one of them; where nothing has answered and the case
  // is not about to submit, give the form settle_ms (absence cannot be waited for otherwise). The value is read
  // again after the wait, so a clamp that landed late is seen.
  const typed = String(c.value);
  let problems = await dialogProblems(dialog);
  const answered = async () => {
    problems = await dialogProblems(dialog);
    const value = await field.inputValue();  // a clamp: another value, not the empty field of a re-render
    return !problems.submit_enabled || problems.fields.some((f) => f.name === c.param)
      || (value !== typed && value !== '');
  };
  if (!c.submit) {
    await pollUntil(answered, args.settle_ms ?? 5000);
  }
  const result = { param: c.param, value: c.value, value_after_blur: await field.inputValue() };
  result.problems = problems;
  if (c.submit && problems.submit_enabled) {
    const posted = page.waitForResponse((r) => r.request().method() === 'POST'
      && new URL(r.url()).pathname === `/api/v2/dags/${args.dag_id}/dagRuns`);
    await dialog.getByTestId('trigger-dag-submit').click();
    const response = await posted;
    result.status = response.status();
    result.sent = JSON.parse(response.request().postData() ?? 'null');
    if (!response.ok()) {
      await dialog.getByTestId('error-alert').waitFor();
      result.problems = await dialogProblems(dialog);
    }
  }
  result.screenshot = await screenshotDialog(page, dialog, c.shot);
  return result;
}

await scenario(`bad-values-${args.dag_id}`, async (page) => {
  const cases = [];
  for (const c of args.cases) {
    const started = Date.now();
    cases.push({ ...(await tryCase(page, c)), seconds: (Date.now() - started) / 1000 });
  }
  return { cases };
});
