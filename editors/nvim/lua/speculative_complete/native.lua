-- Neovim 0.12+: its own vim.lsp.inline_completion requests, draws and accepts suggestions. This
-- module turns it on for the plugin's buffers and adds what it lacks:
--   * the request in flight is cancelled at every keystroke (the server stops decoding at once);
--   * an answer that arrives after the buffer changed is dropped (Neovim would draw it, shifted);
--   * a suggestion that the text typed since contradicts is hidden (Neovim keeps drawing it).
-- The last two wrap two methods of Neovim's private Completor class, only for this plugin's
-- client, the way its folding-range and document-color modules check `ctx.version`; when that
-- class is not found (another Neovim version) the wrappers are skipped and the rest still works.

local lsp_client = require('speculative_complete.client')

local api = vim.api
local M = {}

local attached = {} ---@type table<integer, integer> bufnr -> the plugin's client id there
local enabled = true

--- Whether the item's text begins with what is typed between its start and the cursor.
local function fits_typed_text(bufnr, item)
  local text = item.insert_text
  local winid = vim.fn.bufwinid(bufnr)
  if type(text) ~= 'string' or not item.range or winid == -1 then
    return true -- nothing to check against
  end
  local ok, row, col = pcall(function()
    return unpack(item.range.start:to_extmark())
  end)
  if not ok then
    return true
  end
  local cursor = api.nvim_win_get_cursor(winid)
  if cursor[1] - 1 ~= row or cursor[2] < col then
    return false
  end
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local typed = line:sub(col + 1, cursor[2])
  return text:sub(1, #typed) == typed
end

local guarded = false

local function install_guards()
  local ok, Completor = pcall(function()
    local _ = vim.lsp.inline_completion -- loads the module, which registers the class
    return vim.lsp._capability.all.inline_completion
  end)
  if guarded or not ok or type(Completor) ~= 'table' then
    return
  end
  local handler, show = Completor.handler, Completor.show
  if type(handler) ~= 'function' or type(show) ~= 'function' then
    return
  end
  guarded = true

  function Completor.handler(self, err, result, ctx)
    local ours = ctx and attached[ctx.bufnr] == ctx.client_id
    if ours and ctx.version ~= vim.lsp.util.buf_versions[ctx.bufnr] then
      return -- asked about an older text of the buffer
    end
    return handler(self, err, result, ctx)
  end

  function Completor.show(self, ...)
    local current = self.current
    if current and attached[self.bufnr] == current.client_id and not fits_typed_text(self.bufnr, current) then
      self.current = nil
      return self:hide()
    end
    return show(self, ...)
  end
end

--- Whether the two guards above are in place (for :checkhealth).
function M.guarded()
  return guarded
end

function M.attach(bufnr, client)
  install_guards()
  attached[bufnr] = client.id
  local group = api.nvim_create_augroup('speculative_complete.native.' .. bufnr, { clear = true })
  api.nvim_create_autocmd('TextChangedI', {
    group = group,
    buffer = bufnr,
    callback = function()
      lsp_client.cancel_inline(client, bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'LspDetach', 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.event ~= 'LspDetach' or (args.data and args.data.client_id == client.id) then
        attached[bufnr] = nil
        pcall(api.nvim_del_augroup_by_id, group)
      end
    end,
  })
  -- On for the buffer (Neovim's default is off), and off for the client while toggled off.
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
  if not enabled then
    vim.lsp.inline_completion.enable(false, { client_id = client.id })
  end
end

--- Ask again where the cursor is (the model just became ready), if `bufnr` is in Insert mode:
--- Neovim asks only on InsertEnter, CursorMovedI and TextChangedP. Through its Completor (the
--- class the guards wrap), else by running that Completor's own CursorMovedI autocommand.
function M.reask(bufnr)
  if not attached[bufnr] or not enabled or api.nvim_get_current_buf() ~= bufnr then
    return
  end
  if api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then
    return
  end
  local ok = pcall(function()
    local completor = vim.lsp._capability.all.inline_completion.active[bufnr]
    completor:request(vim.lsp.protocol.InlineCompletionTriggerKind.Automatic)
  end)
  if not ok then
    pcall(api.nvim_exec_autocmds, 'CursorMovedI', {
      group = 'nvim.lsp.inline_completion:' .. bufnr,
      modeline = false,
    })
  end
end

function M.accept(bufnr)
  return attached[bufnr] ~= nil and vim.lsp.inline_completion.get({ bufnr = bufnr })
end

function M.configure(config)
  enabled = config.enabled
end

--- Turn suggestions on or off for the plugin's client only (other servers' stay as they are).
function M.set_enabled(flag)
  enabled = flag
  local client = lsp_client.get()
  if client then
    vim.lsp.inline_completion.enable(flag, { client_id = client.id })
  end
end

return M
