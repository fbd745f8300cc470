/**
 * Playwright/Galata configuration for jupyter-gpupool's browser tests.
 *
 * The browser is Debian's Chromium (`apt-get install chromium`), never one
 * downloaded by Playwright (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 at install).
 * `webServer` starts a real JupyterLab with the gpupool server extension on
 * simulated GPUs (jupyter_server_test_config.py) and stops it afterwards.
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.GPUPOOL_UI_PORT || '8899';
const url = `http://127.0.0.1:${port}`;
process.env.TARGET_URL = process.env.TARGET_URL || url;

module.exports = {
  ...baseConfig,
  reporter: [['list']],
  timeout: 180000,
  expect: { timeout: 20000 },
  workers: 1,
  retries: 0,
  use: {
    ...baseConfig.use,
    baseURL: url,
    viewport: { width: 1280, height: 800 },
    // Traces and videos need Playwright's own downloads (ffmpeg): off.
    trace: 'off',
    video: 'off',
    screenshot: 'off',
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage'
      ]
    }
  },
  webServer: {
    command: 'jupyter lab --config jupyter_server_test_config.py',
    url: `${url}/lab`,
    timeout: 120000,
    reuseExistingServer: !!process.env.GPUPOOL_UI_REUSE,
    stdout: 'pipe',
    stderr: 'pipe'
  }
};
