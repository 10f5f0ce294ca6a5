/**
 * Which document changes are partial accepts, and what the server is told of them and of the
 * whole accept that may follow (partialAccept.ts), on a document kept as lines of text.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PartialAccepts, type Position } from '../partialAccept';

const URI = 'file:///work/point.py';
const BODY = 'self.x += dx\n        self.y += dy';

/** A document of lines the tests edit as VS Code would, feeding the changes to `partial`. */
class Document {
  version = 1;
  constructor(
    readonly partial: PartialAccepts,
    public lines: string[],
  ) {}

  private offset(at: Position): number {
    return this.lines.slice(0, at.line).join('\n').length + (at.line > 0 ? 1 : 0) + at.character;
  }

  /** Insert `text` at `at`; the change the partial accepts are told of. */
  insert(at: Position, text: string): void {
    const whole = this.lines.join('\n');
    const offset = this.offset(at);
    this.lines = (whole.slice(0, offset) + text + whole.slice(offset)).split('\n');
    this.version++;
    this.partial.changed(URI, this.version, { at, text }, (start) => {
      const from = this.offset(start);
      return from <= offset ? whole.slice(from, offset) : undefined; // before the insertion
    });
  }
}

function setUp(): { partial: PartialAccepts; doc: Document } {
  const partial = new PartialAccepts();
  const doc = new Document(partial, ['    def move(self, dx, dy):', '        ']);
  partial.answered(URI, [{ start: { line: 1, character: 8 }, text: BODY }]);
  return { partial, doc };
}

describe('partial accepts', () => {
  it('are insertions continuing an item, followed by a cursor move not by the user', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'self');
    assert.equal(partial.selectionChanged(URI, doc.version, false), 'self');
    doc.insert({ line: 1, character: 12 }, '.');
    assert.equal(partial.selectionChanged(URI, doc.version, false), '.');
    doc.insert({ line: 1, character: 13 }, 'x += dx\n');
    assert.equal(partial.selectionChanged(URI, doc.version, false), 'x += dx\n');
    // The whole accept of the rest runs the item's command with the whole text: only the rest is told.
    assert.equal(partial.wholeAccepted(URI, BODY), '        self.y += dy');
  });

  it('are not keys typed along the suggestion (the keyboard moves the cursor)', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 's');
    assert.equal(partial.selectionChanged(URI, doc.version, true), undefined);
    assert.equal(partial.wholeAccepted(URI, BODY), BODY); // typed text is told with the whole, as before
  });

  it('are not insertions that leave the suggestion, come elsewhere, or end it', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'selfish');
    assert.equal(partial.selectionChanged(URI, doc.version, false), undefined);
    const fresh = setUp();
    fresh.doc.insert({ line: 0, character: 0 }, 'self');
    assert.equal(fresh.partial.selectionChanged(URI, fresh.doc.version, false), undefined);
    const whole = setUp();
    whole.doc.insert({ line: 1, character: 8 }, BODY); // VS Code's whole accept: the command tells
    assert.equal(whole.partial.selectionChanged(URI, whole.doc.version, false), undefined);
    assert.equal(whole.partial.wholeAccepted(URI, BODY), BODY);
  });

  it('are not told when the document changed again before the cursor moved', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'self');
    const version = doc.version;
    doc.version++; // another change with no insertion
    partial.changed(URI, doc.version, undefined, () => undefined);
    assert.equal(partial.selectionChanged(URI, version, false), undefined);
    assert.equal(partial.selectionChanged(URI, doc.version, false), undefined);
  });

  it('follow the next answer too: VS Code shows the older item until it comes', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'self');
    assert.equal(partial.selectionChanged(URI, doc.version, false), 'self');
    const rest = BODY.slice('self'.length);
    partial.answered(URI, [{ start: { line: 1, character: 12 }, text: rest }]);
    doc.insert({ line: 1, character: 12 }, '.');
    assert.equal(partial.selectionChanged(URI, doc.version, false), '.');
    assert.equal(partial.wholeAccepted(URI, rest), rest.slice(1)); // the new item, accepted whole
    assert.equal(partial.wholeAccepted(URI, BODY), BODY.slice('self.'.length)); // or the older one
  });

  it('follow an item VS Code goes on showing through several newer answers', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'self');
    assert.equal(partial.selectionChanged(URI, doc.version, false), 'self');
    partial.answered(URI, [{ start: { line: 1, character: 12 }, text: BODY.slice('self'.length) }]);
    doc.insert({ line: 1, character: 12 }, '.x += dx\n');
    assert.equal(partial.selectionChanged(URI, doc.version, false), '.x += dx\n');
    partial.answered(URI, [{ start: { line: 2, character: 0 }, text: '        self.y += dy' }]);
    partial.answered(URI, [{ start: { line: 2, character: 0 }, text: '        self.y += dy' }]);
    assert.equal(partial.wholeAccepted(URI, BODY), '        self.y += dy'); // the first item, still shown
  });

  it('are forgotten with the document', () => {
    const { partial, doc } = setUp();
    doc.insert({ line: 1, character: 8 }, 'self');
    partial.forget(URI);
    assert.equal(partial.selectionChanged(URI, doc.version, false), undefined);
    assert.equal(partial.wholeAccepted(URI, BODY), BODY);
  });
});
