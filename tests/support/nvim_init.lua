-- The whole Neovim configuration of tests/e2e/test_editor_nvim.py: this plugin, set up for the real
-- server, plus observers that only record what happens (they change nothing):
--   _G.test.events: inline-completion requests sent / answered / cancelled, and every extmark
--     drawn with virtual text (the ghost text of either path), in the order they happened, each
--     with the buffer's changedtick at that moment;
--   _G.test.notes: every vim.notify message;
--   _G.test.commands: every workspace/executeCommand a client sent (command, arguments) and, once
--     answered, the error (vim.NIL for none): what the server was told was accepted;
--   work-done progress of any client ('progress_begin' / 'progress_report' / 'progress_end', with
--     its token) among the events.
local env = vim.env
vim.opt.rtp:prepend(env.SC_PLUGIN_DIR)
vim.opt.swapfile = false
vim.opt.shadafile = 'NONE'

_G.test = { events = {}, notes = {}, commands = {} }
local events = _G.test.events
local api = vim.api

local set_extmark = api.nvim_buf_set_extmark
api.nvim_buf_set_extmark = function(bufnr, ns, row, col, opts)
  if type(opts) == 'table' and opts.virt_text then
    table.insert(events, {
      kind = 'drawn',
      tick = api.nvim_buf_get_changedtick(bufnr),
      row = row,
      col = col,
      text = opts.virt_text[1] and opts.virt_text[1][1] or '',
    })
  end
  return set_extmark(bufnr, ns, row, col, opts)
end

local notify = vim.notify
vim.notify = function(message, level, opts)
  table.insert(_G.test.notes, { message = message, level = level or vim.log.levels.INFO })
  return notify(message, level, opts)
end

api.nvim_create_autocmd('LspRequest', {
  callback = function(args)
    local request = args.data.request
    if request.method == 'textDocument/inlineCompletion' then
      table.insert(events, {
        kind = request.type, -- pending | complete | cancel
        id = args.data.request_id,
        tick = api.nvim_buf_get_changedtick(request.bufnr),
      })
    end
  end,
})

-- The client's request method, wrapped per client (both paths send their commands through it).
api.nvim_create_autocmd('LspAttach', {
  callback = function(args)
    local client = vim.lsp.get_client_by_id(args.data.client_id)
    if not client or client.test_wrapped then
      return
    end
    client.test_wrapped = true
    local request = client.request
    client.request = function(self, method, params, handler, ...)
      if method == 'workspace/executeCommand' then
        local entry = { command = params.command, arguments = params.arguments }
        table.insert(_G.test.commands, entry)
        local inner = handler or vim.lsp.handlers[method]
        handler = function(err, ...)
          entry.error = err and (err.message or tostring(err)) or vim.NIL
          if inner then
            return inner(err, ...)
          end
        end
      end
      return request(self, method, params, handler, ...)
    end
  end,
})

api.nvim_create_autocmd('LspProgress', {
  callback = function(args)
    local params = args.data.params or {}
    table.insert(events, {
      kind = 'progress_' .. tostring(type(params.value) == 'table' and params.value.kind),
      token = params.token,
      tick = api.nvim_buf_get_changedtick(0),
    })
  end,
})

require('speculative_complete').setup({
  cmd = { env.SC_PYTHON, '-m', 'speculative_complete.lsp_server' },
  ghost_text = env.SC_GHOST_TEXT,
  -- A roomy budget: the test checks what the editor shows, not how fast a loaded machine is.
  -- SC_SETTINGS (JSON) adds server settings, e.g. an endpoint.
  settings = vim.tbl_extend('force', { timeBudgetMs = 60000 }, env.SC_SETTINGS and vim.json.decode(env.SC_SETTINGS) or {}),
})
