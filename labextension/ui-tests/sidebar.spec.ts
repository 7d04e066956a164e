/**
 * The sidebar end to end: a real JupyterLab and kernel, %load_ext jupyter_dist, 2 nodes x 2
 * procs set in the sidebar, the inserted %%distrun cell run on 4 ranks, the status followed, and
 * every rank's stack shown by the Stacks button while the cell runs.
 */
import { expect, Page, test } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

const ARTIFACTS = path.resolve(__dirname, '..', '..', 'test-artifacts');
const SETTINGS = path.join(ARTIFACTS, 'lab', 'settings', 'jupyter-dist', 'plugin.jupyterlab-settings');

async function kernelMenu(page: Page, item: string): Promise<void> {
  await page.locator('.lm-MenuBar-itemLabel', { hasText: /^Kernel$/ }).click();
  await page.locator('.lm-Menu-itemLabel', { hasText: item }).first().click();
}

async function runActiveCell(page: Page): Promise<void> {
  await page.keyboard.press('Control+Enter');
}

test('configure, insert and run a %%distrun cell from the sidebar', async ({ page }) => {
  page.on('console', msg => {
    if (msg.text().includes('jupyter-dist')) {
      console.log(`[browser] ${msg.text()}`);
    }
  });
  await page.goto('/lab/tree/dist.ipynb');
  await page.waitForSelector('#jupyterlab-splash', { state: 'detached', timeout: 60_000 });
  await page.waitForSelector('.jp-Notebook .jp-Cell', { timeout: 60_000 });

  // open the sidebar: before %load_ext it asks for it, it is not an error
  await page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-dist:sidebar"]').click();
  const sidebar = page.locator('.jp-dist-sidebar');
  const headline = sidebar.locator('.jp-dist-headline');
  await expect(sidebar).toBeVisible();
  await expect(headline).toHaveText('run %load_ext jupyter_dist in this notebook', { timeout: 60_000 });
  await expect(sidebar.locator('.jp-dist-error')).toHaveText('');

  // %load_ext in the first cell: the kernel announces the target and the sidebar connects
  const cells = page.locator('.jp-Notebook .jp-Cell');
  await cells.nth(0).locator('.cm-content').click();
  await page.keyboard.insertText('%load_ext jupyter_dist');
  await runActiveCell(page);
  await expect(headline).toHaveText(/^cluster stopped/, { timeout: 60_000 });
  await expect(sidebar).toHaveAttribute('data-transport', 'subshell');

  // 2 nodes x 2 procs
  await sidebar.locator('select[name=framework]').selectOption('pytorch');
  await sidebar.locator('input[name=nodes]').fill('2');
  await sidebar.locator('input[name=nodes]').press('Tab');
  await sidebar.locator('input[name=procs_per_node]').fill('2');
  await sidebar.locator('input[name=procs_per_node]').press('Tab');
  await expect(sidebar.locator('.jp-dist-world')).toHaveText('world size 4 (2 × 2)');
  await expect(sidebar.locator('.jp-dist-grid td.jp-dist-cell')).toHaveCount(4);

  // insert the cell below the active one
  await sidebar.getByRole('button', { name: 'Insert %%distrun cell' }).click();
  await expect(cells).toHaveCount(2);
  const runCell = cells.nth(1);
  await expect(runCell.locator('.cm-content')).toContainText('%%distrun -f pytorch -N 2 -n 2');
  await expect(runCell.locator('.cm-content')).toContainText('# runs on every rank');

  // add a body and run it, watching the sidebar's cluster state while it runs
  await runCell.locator('.cm-content').click();
  await page.keyboard.press('Control+End');
  await page.keyboard.insertText(
    "\nimport os, time\nprint('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\ntime.sleep(10)\n"
  );
  await page.evaluate(() => {
    const node = document.querySelector('.jp-dist-sidebar') as HTMLElement;
    const seen: string[] = [];
    (window as any).__distSeen = seen;
    new MutationObserver(() => seen.push(node.dataset.cluster ?? '')).observe(node, {
      attributes: true,
      attributeFilter: ['data-cluster']
    });
  });
  await runActiveCell(page);

  await expect(sidebar).toHaveAttribute('data-cluster', 'busy', { timeout: 180_000 });
  await expect(sidebar.locator('.jp-dist-grid td.jp-dist-state-busy')).toHaveCount(4);
  await expect(headline).toHaveText(/^cluster busy \(4\/4 engines, pytorch\)/);
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: path.join(ARTIFACTS, 'sidebar-running.png') });

  const output = runCell.locator('.jp-OutputArea');
  for (let rank = 0; rank < 4; rank++) {
    await expect(output).toContainText(`hello from rank ${rank} of 4`, { timeout: 120_000 });
  }

  // every rank sleeps in the cell: the Stacks button answers over the subshell meanwhile
  const stacks = sidebar.locator('.jp-dist-stacks');
  await expect(stacks).toBeHidden();
  const asked = Date.now();
  await sidebar.getByRole('button', { name: 'Stacks' }).click();
  await expect(stacks).toContainText(/ranks 0-3: time\.sleep at <cell>:\d+/, { timeout: 10_000 });
  console.log(`Stacks button answered in ${Date.now() - asked} ms while the cell ran`);
  await expect(sidebar).toHaveAttribute('data-cluster', 'busy');
  await page.screenshot({ path: path.join(ARTIFACTS, 'sidebar-stacks.png') });
  await expect(sidebar).toHaveAttribute('data-cluster', 'idle', { timeout: 60_000 });
  await expect(sidebar.locator('.jp-dist-grid td.jp-dist-state-idle')).toHaveCount(4);
  const seen: string[] = await page.evaluate(() => (window as any).__distSeen);
  console.log(`sidebar cluster states seen: ${seen.join(' -> ')}`);
  expect(seen).toContain('starting');
  expect(seen).toContain('busy');
  expect(seen[seen.length - 1]).toBe('idle');
  await page.screenshot({ path: path.join(ARTIFACTS, 'sidebar.png') });

  // the sidebar remembered the settings in JupyterLab's settings registry
  await expect
    .poll(() => (fs.existsSync(SETTINGS) ? fs.readFileSync(SETTINGS, 'utf8') : ''), { timeout: 10_000 })
    .toMatch(/"nodes":\s*2/);
  expect(fs.readFileSync(SETTINGS, 'utf8')).toMatch(/"procs_per_node":\s*2/);

  // a kernel restart drops the comm target: back to the hint; no kernel: "no kernel"
  await kernelMenu(page, 'Restart Kernel…');
  await page.locator('.jp-Dialog .jp-mod-accept').click();
  await expect(headline).toHaveText('run %load_ext jupyter_dist in this notebook', { timeout: 60_000 });
  await kernelMenu(page, 'Shut Down Kernel');
  const confirm = page.locator('.jp-Dialog .jp-mod-accept');
  if (await confirm.isVisible({ timeout: 2_000 }).catch(() => false)) {
    await confirm.click();
  }
  await expect(headline).toHaveText('no kernel', { timeout: 60_000 });
});

