/**
 * Partial accepts (VS Code's `editor.action.inlineSuggest.acceptNextWord` / `acceptNextLine`)
 * told to the server as lsp_server's `lsp_server.accepted` command tells of a whole one, with the
 * accepted text only.
 *
 * VS Code tells a provider of a partial accept only through `handleDidPartiallyAcceptCompletionItem`,
 * a proposed API (inlineCompletionsAdditions) up to VS Code 1.100 at least: an extension outside
 * VS Code's own list cannot use it, and registering a provider that has it throws. So the partial
 * accept is recognized from what a stable extension sees: the document changes by an insertion
 * that continues an item of the last answers where the item's text stands, and the cursor's move
 * that follows is not the keyboard's or the mouse's (VS Code moves it with its own source, which
 * the API reports as no kind). A key typed along the suggestion moves it by the keyboard.
 *
 * The item's command is fixed when it is answered: after partial accepts, the whole accept of the
 * rest runs it with the whole text, and only what was not told yet is sent.
 */

/** lsp_server's command on every item it answers: arguments [the document's URI, the text]. */
export const ACCEPTED_COMMAND = 'lsp_server.accepted';

/** A position as VS Code's (0-based line, UTF-16 character). */
export interface Position {
  line: number;
  character: number;
}

/** An item of an answer: where its text starts replacing the document, and the text. */
export interface Answered {
  start: Position;
  text: string;
}

interface Offer extends Answered {
  told: number; // the length of the text's beginning the server was told of by partial accepts
}

interface Candidate {
  offer: Offer;
  end: number; // where the insertion ends in the offer's text
}

interface Pending {
  uri: string;
  version: number;
  text: string; // inserted
  candidates: Candidate[];
}

/** The answers per document whose items may still be shown. VS Code asks again after each partial
 * accept but may go on showing the older item through several answers (all of them at once when
 * the server answers fast), so more than the last two are kept. */
const ANSWERS_KEPT = 8;

export class PartialAccepts {
  private readonly answers = new Map<string, Offer[][]>(); // per document URI, newest first
  private pending: Pending | undefined;

  /** An answer for the document `uri`. */
  answered(uri: string, items: readonly Answered[]): void {
    const offers = items.map((item) => ({ ...item, told: 0 }));
    this.answers.set(uri, [offers, ...(this.answers.get(uri) ?? [])].slice(0, ANSWERS_KEPT));
  }

  forget(uri: string): void {
    this.answers.delete(uri);
    if (this.pending?.uri === uri) {
      this.pending = undefined;
    }
  }

  /**
   * The document `uri` changed (now at `version`): by `inserted` alone at `at`, or otherwise
   * (undefined). `textFrom(start)` is the document's text from `start` to `at`, undefined when
   * `start` is after `at`.
   */
  changed(
    uri: string,
    version: number,
    inserted: { at: Position; text: string } | undefined,
    textFrom: (start: Position) => string | undefined,
  ): void {
    this.pending = undefined;
    if (!inserted || inserted.text === '') {
      return;
    }
    const candidates: Candidate[] = [];
    for (const offer of (this.answers.get(uri) ?? []).flat()) {
      const typed = textFrom(offer.start);
      const end = (typed ?? '').length + inserted.text.length;
      // A part: the whole rest would be VS Code's whole accept, which runs the item's command.
      if (typed !== undefined && end < offer.text.length && offer.text.startsWith(typed + inserted.text)) {
        candidates.push({ offer, end });
      }
    }
    if (candidates.length > 0) {
      this.pending = { uri, version, text: inserted.text, candidates };
    }
  }

  /**
   * The cursor moved in the document `uri` (at `version`); `byUser`: by the keyboard or the
   * mouse. The text to tell the server was accepted, when the change before was a partial accept.
   */
  selectionChanged(uri: string, version: number, byUser: boolean): string | undefined {
    const pending = this.pending;
    if (!pending || pending.uri !== uri) {
      return undefined;
    }
    this.pending = undefined;
    if (byUser || pending.version !== version) {
      return undefined; // typed along the suggestion, or changed again since
    }
    for (const { offer, end } of pending.candidates) {
      offer.told = end;
    }
    return pending.text;
  }

  /** What the whole-accept command of an item with `text` should tell: what is not told yet (of
   * the items with that text, the one partial accepts went furthest along: the one shown). */
  wholeAccepted(uri: string, text: string): string {
    const told = (this.answers.get(uri) ?? [])
      .flat()
      .filter((o) => o.text === text)
      .reduce((most, o) => Math.max(most, o.told), 0);
    return text.slice(told);
  }
}
