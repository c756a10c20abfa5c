// Shared by the browser tier's scenario scripts (tests/browser/*.mjs): the system Chromium driven by
// playwright-core, the Airflow UI's login, the trigger dialog, and the one-line JSON result the Python tests read.
//
// A scenario script is run as `node tests/browser/<scenario>.mjs '<json args>'`; common args:
//   url, username, password  the api-server and a user of the simple auth manager
//   chromium                 the browser executable (no browser is ever downloaded)
//   shots                    directory for screenshots (and page dumps of a failure)
//   state                    file that keeps the login (storage state) between scenarios
//   timeout_ms               the wait for any UI state (generous: the machine is slow and shared)
// It prints `RESULT {json}` on stdout and exits 0, or prints `RESULT {"ok": false, "error": ...}` and exits 1 after
// saving <name>-FAILED.png and <name>-FAILED.html.
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

export const args = JSON.parse(process.argv[2] ?? '{}');
export const TIMEOUT = args.timeout_ms ?? 120000;

export async function scenario(name, body) {
  const browser = await chromium.launch({
    executablePath: args.chromium,
    // Root in CI: Chromium's sandbox needs user namespaces; --no-sandbox is what playwright passes by default too.
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
    timeout: TIMEOUT,
  });
  const haveState = args.state && fs.existsSync(args.state);
  const context = await browser.newContext({
    viewport: { width: 1400, height: 1000 },
    storageState: haveState ? args.state : undefined,
  });
  context.setDefaultTimeout(TIMEOUT);
  context.setDefaultNavigationTimeout(TIMEOUT);
  const page = await context.newPage();
  const consoleErrors = [];
  page.on('pageerror', (err) => consoleErrors.push(String(err).slice(0, 500)));
  let code = 0;
  try {
    const result = await body(page);
    console.log('RESULT ' + JSON.stringify({ ok: true, page_errors: consoleErrors, ...result }));
  } catch (err) {
    code = 1;
    const shot = path.join(args.shots ?? '.', `${name}-FAILED.png`);
    let url = null;
    try {
      url = page.url();
      await page.screenshot({ path: shot, fullPage: true });
      fs.writeFileSync(shot.replace(/\.png$/, '.html'), await page.content());
    } catch { /* the page may be gone */ }
    console.log('RESULT ' + JSON.stringify({ ok: false, error: String(err?.stack ?? err).slice(0, 4000), url, shot,
                                             page_errors: consoleErrors }));
  } finally {
    await browser.close();
  }
  process.exit(code);
}

/** Open a UI path, logging in through the sign-in form when the app sends us there. */
export async function open(page, uiPath) {
  await page.goto(args.url + uiPath);
  const login = page.getByRole('button', { name: 'Sign in' });
  const app = page.getByTestId('nav-sidebar');
  await login.or(app).first().waitFor();
  if (await login.isVisible()) {
    await page.getByLabel('Username').fill(args.username);
    await page.getByLabel('Password').fill(args.password);
    await login.click();
    await app.waitFor();
    if (args.state) await page.context().storageState({ path: args.state });
    if (!page.url().startsWith(args.url + uiPath.split('?')[0])) await page.goto(args.url + uiPath);
  }
}

/** Open a DAG's page and its trigger dialog; waits until every param's field is rendered. Returns the dialog. */
export async function openTriggerDialog(page, dagId, paramNames) {
  await open(page, `/dags/${encodeURIComponent(dagId)}`);
  await page.getByTestId('trigger-dag-button').click();
  const dialog = page.getByRole('dialog');
  await dialog.getByTestId('trigger-dag-submit').waitFor();
  for (const name of paramNames) await dialog.locator(`[name="element_${name}"]`).waitFor({ state: 'attached' });
  return dialog;
}

/** What the dialog shows as wrong: the fields in error (label + message) and the alert of a refused trigger. */
export async function dialogProblems(dialog) {
  const fields = await dialog.locator('[data-scope="field"][data-part="root"][data-invalid]').evaluateAll((roots) =>
    roots.map((root) => ({
      label: root.querySelector('label')?.textContent?.replace('*', '').trim() ?? null,
      name: root.querySelector('[name^="element_"]')?.getAttribute('name')?.replace(/^element_/, '') ?? null,
      message: root.querySelector('[data-part="error-text"]')?.textContent?.trim() ?? null,
    })));
  const alert = dialog.getByTestId('error-alert');
  const alertText = (await alert.count()) ? (await alert.first().innerText()).trim() : null;
  const submitEnabled = await dialog.getByTestId('trigger-dag-submit').isEnabled();
  return { fields, alert: alertText, submit_enabled: submitEnabled };
}

/** Poll `check` (an async predicate) until it holds; the last value is returned either way. */
export async function pollUntil(check, timeoutMs = TIMEOUT, intervalMs = 250) {
  const deadline = Date.now() + timeoutMs;
  let value = await check();
  while (!value && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
    value = await check();
  }
  return value;
}

/** A screenshot of the whole dialog: the viewport grows to the dialog's height (it scrolls inside the page). */
export async function screenshotDialog(page, dialog, file) {
  const height = await dialog.evaluate((el) => el.scrollHeight);
  await page.setViewportSize({ width: 1400, height: Math.min(Math.max(1000, height + 160), 12000) });
  await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
  const target = path.join(args.shots, file);
  await page.screenshot({ path: target });
  await page.setViewportSize({ width: 1400, height: 1000 });
  return target;
}
