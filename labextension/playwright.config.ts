/**
 * Browser test of the sidebar against a real JupyterLab, driven with Debian's chromium.
 * Never downloads a browser: `executablePath` points at /usr/bin/chromium.
 */
import { defineConfig } from '@playwright/test';

const port = Number(process.env.UI_PORT ?? 8899);

export default defineConfig({
  testDir: 'ui-tests',
  outputDir: '../test-artifacts/playwright',
  timeout: 300_000,
  retries: 0,
  workers: 1,
  reporter: [['list']],
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    browserName: 'chromium',
    viewport: { width: 1400, height: 900 },
    trace: 'retain-on-failure',
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run'
      ]
    }
  },
  webServer: {
    command: 'ui-tests/start-lab.sh',
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120_000,
    reuseExistingServer: false,
    env: { UI_PORT: String(port) }
  }
});
