// Open a task instance's page (its Logs tab is the default) as a user following a red square would, wait for a
// text to appear in the log, wrap long lines (the log viewer's `w` hotkey) and screenshot it.
// Args (besides lib.mjs's): dag_id, run_id, task_id, try_number, expect (a substring), shot.
import path from 'node:path';
import { args, open, scenario } from './lib.mjs';

await scenario(`task-log-${args.dag_id}-${args.task_id}`, async (page) => {
  const uiPath = `/dags/${encodeURIComponent(args.dag_id)}/runs/${encodeURIComponent(args.run_id)}`
    + `/tasks/${encodeURIComponent(args.task_id)}?try_number=${args.try_number ?? 1}`;
  await open(page, uiPath);
  const list = page.getByTestId('virtualized-list');
  await list.waitFor();
  const hit = list.getByText(args.expect, { exact: false });
  await hit.first().waitFor();
  const texts = await hit.allInnerTexts();
  await page.keyboard.press('w');  // wrap: the error line is wider than the log pane
  const header = page.getByTestId('header-card');
  const target = path.join(args.shots, args.shot);
  await hit.first().scrollIntoViewIfNeeded();
  await page.screenshot({ path: target });
  return { texts: texts.map((t) => t.trim()), state: (await header.innerText()).replace(/\s+/g, ' ').trim(),
           screenshot: target,
           url: page.url() };
});
