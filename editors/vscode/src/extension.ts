/**
 * Speculative Complete: whole-line ghost text from `lsp_server --stdio` through VS Code's inline
 * completions (vscode-languageclient 11 registers the provider when the server offers it).
 */
import * as vscode from 'vscode';
import { Controller } from './controller';
import { SECTION } from './settings';

let controller: Controller | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel('Speculative Complete', { log: true });
  const item = vscode.window.createStatusBarItem('lspServer.status', vscode.StatusBarAlignment.Right, 100);
  item.name = 'Speculative Complete';
  item.command = 'lspServer.toggle';
  controller = new Controller(output, item);
  const active = controller;
  context.subscriptions.push(
    output,
    item,
    active,
    vscode.commands.registerCommand('lspServer.toggle', () => active.toggle()),
    vscode.commands.registerCommand('lspServer.showStats', () => active.showStats()),
    vscode.commands.registerCommand('lspServer.restart', () => active.restart()),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (event.affectsConfiguration(SECTION)) {
        void active.configurationChanged();
      }
    }),
  );
  await active.start();
}

export async function deactivate(): Promise<void> {
  await controller?.stop();
  controller = undefined;
}
