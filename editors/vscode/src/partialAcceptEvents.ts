/**
 * VS Code's side of partial accepts (partialAccept.ts decides): its answers, document changes and
 * cursor moves fed to a PartialAccepts, and the accepted parts it recognizes handed to `tell`.
 */
import * as vscode from 'vscode';
import { ACCEPTED_COMMAND, type Answered, type PartialAccepts } from './partialAccept';

/** The items of an answer that lsp_server answered (plain text, with its command). */
export function answeredItems(
  result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined,
  position: vscode.Position,
): Answered[] {
  const items = Array.isArray(result) ? result : (result?.items ?? []);
  return items
    .filter((item) => typeof item.insertText === 'string' && item.command?.command === ACCEPTED_COMMAND)
    .map((item) => ({ start: item.range?.start ?? position, text: item.insertText as string }));
}

function lf(text: string): string {
  return text.replace(/\r\n/g, '\n'); // the server's texts break lines with \n
}

function onChange(partial: PartialAccepts, event: vscode.TextDocumentChangeEvent): void {
  const { document, contentChanges, reason } = event;
  const [change, ...more] = contentChanges;
  const inserted =
    change && more.length === 0 && change.rangeLength === 0 && reason === undefined
      ? { at: change.range.start, text: lf(change.text) }
      : undefined;
  partial.changed(document.uri.toString(), document.version, inserted, (start) => {
    const from = new vscode.Position(start.line, start.character);
    return inserted && !inserted.at.isBefore(from)
      ? lf(document.getText(new vscode.Range(from, inserted.at)))
      : undefined;
  });
}

export function watchPartialAccepts(
  partial: PartialAccepts,
  tell: (document: vscode.Uri, text: string) => void,
): vscode.Disposable {
  return vscode.Disposable.from(
    vscode.workspace.onDidChangeTextDocument((event) => onChange(partial, event)),
    vscode.window.onDidChangeTextEditorSelection((event) => {
      const { document } = event.textEditor;
      const byUser =
        event.kind === vscode.TextEditorSelectionChangeKind.Keyboard ||
        event.kind === vscode.TextEditorSelectionChangeKind.Mouse;
      const text = partial.selectionChanged(document.uri.toString(), document.version, byUser);
      if (text !== undefined) {
        tell(document.uri, text);
      }
    }),
    vscode.workspace.onDidCloseTextDocument((document) => partial.forget(document.uri.toString())),
  );
}
