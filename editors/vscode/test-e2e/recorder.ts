/**
 * Runs in the workbench page (added before VS Code loads): records every state of the ghost text
 * and of the extension's status bar item as it is rendered, with the time, so a test can check
 * afterwards what was ever shown, not only what is shown when it looks.
 */

export interface GhostState {
  t: number; // Date.now() in the page: the same clock as the trace's timestamps
  /** The text of the ghost text's line before it, the ghost text, and the line after it. */
  before: string;
  ghost: string;
  after: string;
}

export interface StatusState {
  t: number;
  text: string;
}

export interface Recorded {
  ghosts: GhostState[];
  statuses: StatusState[];
}

/** Serialized into the page by Playwright: it may use nothing from outside its own body. */
export function installRecorder(): void {
  const recorded: Recorded = { ghosts: [], statuses: [] };
  (window as unknown as { __e2e: Recorded }).__e2e = recorded;
  // Rendered spaces are non-breaking; the editor's text has plain ones.
  const plain = (text: string | null): string => (text ?? '').replace(/\u00a0/g, ' ');

  function ghostState(): Omit<GhostState, 't'> {
    const ghosts = Array.from(document.querySelectorAll('.part.editor .monaco-editor [class*="ghost-text"]'));
    // The first line of a suggestion decorates the cursor's line (`ghost-text-decoration`, a span
    // per token); the lines under it are a view zone's (`ghost-text`), which may come first here.
    const first = ghosts.find((element) => element.className.includes('ghost-text-decoration')) ?? ghosts[0];
    const line = first?.closest('.view-line');
    if (!first || !line) {
      return { before: '', ghost: '', after: '' };
    }
    let before = '';
    let ghost = '';
    let after = '';
    for (const span of Array.from(line.querySelectorAll('span > span'))) {
      if (span.className.includes('ghost-text')) {
        ghost += plain(span.textContent);
      } else if (ghost === '') {
        before += plain(span.textContent);
      } else {
        after += plain(span.textContent);
      }
    }
    // Lines of a multi-line suggestion below the cursor's line (a view zone, not in `line`): the
    // spans of one line share their parent.
    const below = new Map<Element, string>();
    for (const extra of ghosts.filter((element) => !line.contains(element))) {
      const row = extra.closest('.view-line') ?? extra.parentElement ?? extra;
      below.set(row, (below.get(row) ?? '') + plain(extra.textContent));
    }
    for (const text of below.values()) {
      ghost += '\n' + text;
    }
    return { before, ghost, after };
  }

  function statusText(): string {
    return plain(document.querySelector('.statusbar-item[id$="lspServer.status"]')?.textContent ?? '').trim();
  }

  function record(): void {
    const now = Date.now();
    const ghost = ghostState();
    const last = recorded.ghosts[recorded.ghosts.length - 1];
    if (!last || last.before !== ghost.before || last.ghost !== ghost.ghost || last.after !== ghost.after) {
      if (ghost.ghost !== '' || (last && last.ghost !== '')) {
        recorded.ghosts.push({ t: now, ...ghost });
      }
    }
    const status = statusText();
    if (status !== '' && recorded.statuses[recorded.statuses.length - 1]?.text !== status) {
      recorded.statuses.push({ t: now, text: status });
    }
  }

  const observer = new MutationObserver(record);
  const start = (): void => {
    observer.observe(document.body, {
      subtree: true,
      childList: true,
      characterData: true,
      attributes: true,
    });
  };
  if (document.body) {
    start();
  } else {
    document.addEventListener('DOMContentLoaded', start);
  }
}
