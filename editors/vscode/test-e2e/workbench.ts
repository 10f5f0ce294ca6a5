/**
 * The VS Code window in Chromium, driven as a user would: the keyboard, Quick Open, the command
 * palette; and read from its DOM: the status bar item, the ghost text, the Output panel.
 */
import type { Browser, Page } from 'playwright-core';
import { type GhostState, installRecorder, type Recorded } from './recorder';

export const STATUS = '.statusbar-item[id$="lspServer.status"]';

export class Workbench {
  private constructor(readonly page: Page) {}

  static async open(browser: Browser, url: string): Promise<Workbench> {
    const page = await browser.newPage({ viewport: { width: 1100, height: 640 } });
    await page.addInitScript(installRecorder);
    await page.goto(url);
    await page.waitForSelector('.monaco-workbench .part.statusbar', { timeout: 120_000 });
    return new Workbench(page);
  }

  /** The status bar item's text, e.g. `Speculative: loading model` (its icon is not text). */
  async status(): Promise<string> {
    const text = await this.page.locator(STATUS).textContent({ timeout: 60_000 });
    return (text ?? '').replace(/\u00a0/g, ' ').trim();
  }

  async statusTooltip(): Promise<string> {
    return (await this.page.locator(STATUS).getAttribute('aria-label')) ?? '';
  }

  async waitForStatus(pattern: RegExp, timeoutMs: number): Promise<string> {
    await this.page.waitForFunction(
      ([selector, source, flags]) => {
        const text = (document.querySelector(selector!)?.textContent ?? '').replace(/\u00a0/g, ' ').trim();
        return new RegExp(source!, flags).test(text);
      },
      [STATUS, pattern.source, pattern.flags],
      { timeout: timeoutMs, polling: 100 },
    );
    return this.status();
  }

  /** Quick Open (Ctrl+P), the file's name, Enter; then the cursor at the end of the file. */
  async openFile(name: string): Promise<void> {
    await this.page.keyboard.press('Control+P');
    await this.page.keyboard.type(name);
    await this.page.waitForSelector(`.quick-input-list .monaco-list-row[aria-label^="${name}"]`, {
      timeout: 30_000,
    });
    await this.page.keyboard.press('Enter');
    await this.page.waitForSelector(`.tab.active[data-resource-name="${name}"]`, { timeout: 30_000 });
    await this.page.waitForSelector('.part.editor .monaco-editor.focused', { timeout: 30_000 });
    await this.page.keyboard.press('Control+End');
  }

  /** A command from the palette (F1), by its title as the palette lists it. */
  async command(title: string): Promise<void> {
    await this.page.keyboard.press('F1');
    await this.page.waitForSelector('.quick-input-widget .quick-input-box input', { state: 'visible' });
    await this.page.keyboard.type(title);
    await this.page.waitForSelector(`.quick-input-list .monaco-list-row[aria-label^="${title}"]`, {
      timeout: 30_000,
    });
    await this.page.keyboard.press('Enter');
    await this.page.waitForSelector('.quick-input-widget', { state: 'hidden' });
  }

  /**
   * Set a text setting in the Settings editor, as a user does. (An edit of settings.json from
   * outside reached code-server's file watcher but never the window's configuration.)
   */
  async setSetting(key: string, value: string): Promise<void> {
    await this.page.keyboard.press('Control+,');
    await this.page.waitForSelector('.settings-editor .suggest-input-container .monaco-editor.focused', {
      timeout: 30_000,
    });
    await this.page.keyboard.press('Control+A');
    await this.page.keyboard.type(key);
    const input = `.settings-editor .setting-item-contents[data-key="${key}"] input`;
    await this.page.waitForSelector(input, { timeout: 30_000 });
    await this.page.fill(input, value);
  }

  async type(text: string): Promise<void> {
    await this.page.keyboard.type(text);
  }

  async press(key: string): Promise<void> {
    await this.page.keyboard.press(key);
  }

  /** Everything the recorder saw so far. */
  async recorded(): Promise<Recorded> {
    return this.page.evaluate(() => (window as unknown as { __e2e: Recorded }).__e2e);
  }

  /** The ghost text now shown, or undefined. */
  async ghost(): Promise<GhostState | undefined> {
    const states = (await this.recorded()).ghosts;
    const last = states[states.length - 1];
    return last && last.ghost !== '' ? last : undefined;
  }

  /** The text of the Output panel's editor (the lines it renders). */
  async outputText(): Promise<string> {
    const lines = await this.page.$$eval('.part.panel .monaco-editor .view-line', (elements) =>
      elements
        .map((element) => ({
          top: parseFloat((element as HTMLElement).style.top),
          text: element.textContent ?? '',
        }))
        .sort((a, b) => a.top - b.top)
        .map((line) => line.text.replace(/\u00a0/g, ' ')),
    );
    return lines.join('\n');
  }

  async screenshot(path: string): Promise<void> {
    await this.page.screenshot({ path });
  }

  /** Close the window as a user closes the tab (its unload handlers run). */
  async close(): Promise<void> {
    await this.page.close({ runBeforeUnload: true });
  }
}
