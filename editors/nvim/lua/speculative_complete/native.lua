-- Neovim 0.12+: its own vim.lsp.inline_completion requests, draws and accepts suggestions. This
-- module turns it on for the plugin's buffers and adds what it lacks:
--   * the request in flight is cancelled at every keystroke (the server stops decoding at once);
--   * an answer that arrives after the buffer changed is dropped (Neovim would draw it, shifted);
--   * a suggestion that the text typed since contradicts is hidden (Neovim keeps drawing it);
--   * partial accept (a word, a line), which Neovim has no API for: the item that
--     vim.lsp.inline_completion.get() hands over is inserted in part, and the rest of it becomes
--     the current item, shown without a new request.
-- The wrappers of Neovim's private Completor class act only for this plugin's client, the way its
-- folding-range and document-color modules check `ctx.version`; when that class is not found
-- (another Neovim version) they are skipped and the rest still works (a partial accept then shows
-- the rest once Neovim asks again).

local lsp_client = require('speculative_complete.client')
local partial = require('speculative_complete.partial')

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

--- Neovim's inline completion of `bufnr` (private: its Completor), or nil.
local function completor_of(bufnr)
  local ok, completor = pcall(function()
    return vim.lsp._capability.all.inline_completion.active[bufnr]
  end)
  return ok and type(completor) == 'table' and completor or nil
end

--- Whether `item` is the rest of a partial accept and nothing changed since it was inserted.
local function is_untouched_rest(bufnr, item)
  local snap = item and item.speculative_rest
  if not snap or api.nvim_get_current_buf() ~= bufnr then
    return false
  end
  local cursor = api.nvim_win_get_cursor(0)
  return snap.tick == api.nvim_buf_get_changedtick(bufnr)
    and snap.row == cursor[1] - 1
    and snap.col == cursor[2]
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

  -- The partial accept's own edit moves the cursor: Neovim would ask again for the rest it shows.
  local automatic_request = Completor.automatic_request
  if type(automatic_request) == 'function' then
    function Completor.automatic_request(self, ...)
      if is_untouched_rest(self.bufnr, self.current) then
        return self:show()
      end
      return automatic_request(self, ...)
    end
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

--- The vim.Pos / vim.Range like `template` (their class, private to Neovim) at other places.
local function pos_like(template, row, col)
  return setmetatable({ row = row, col = col, buf = template.buf }, getmetatable(template))
end

local function range_like(template, start_row, start_col, end_row, end_col)
  local start, end_ =
    pos_like(template.start, start_row, start_col), pos_like(template.end_, end_row, end_col)
  return setmetatable({ start = start, end_ = end_ }, getmetatable(template))
end

---@class speculative_complete.Target
---@field bufnr integer
---@field item vim.lsp.inline_completion.Item
---@field client vim.lsp.Client
---@field row integer the cursor (0-based)
---@field col integer
---@field finish integer[] {row, col} where the item's range ends (the cursor when it has none)

--- The item's command, run for its client; for this plugin's server, `command_for(text)` says
--- what was accepted (another server's command is its own business: it runs whole or not at all).
local function report(target, text)
  local command = target.item.command
  if command and lsp_client.is_ours(target.client) then
    command = partial.command_for(command, text)
  elseif text ~= target.item.insert_text then
    command = nil
  end
  if command then
    lsp_client.execute(target.client, target.bufnr, command)
  end
end

--- The whole item, as Neovim's own accept applies a plain-text one.
local function apply(target)
  local range = target.item.range
  local row, col = target.row, target.col
  if range then
    row, col = range.start.row, range.start.col
  end
  local lines = vim.split(target.item.insert_text, '\n', { plain = true })
  api.nvim_buf_set_text(target.bufnr, row, col, target.finish[1], target.finish[2], lines)
  local last = #lines == 1 and col + #lines[1] or #lines[#lines]
  api.nvim_win_set_cursor(0, { row + #lines, last })
  report(target, target.item.insert_text)
end

--- `part` of the item's rest inserted at the cursor, the server told of it alone, and the rest of
--- the rest made Neovim's current item (its own command tells of that rest only).
local function apply_part(target, rest, part)
  local item, row, col = target.item, target.row, target.col
  local end_row, end_col = partial.shift(target.finish[1], target.finish[2], row, col, part)
  local last_row, last_col = partial.insert(target.bufnr, row, col, part)
  report(target, part)
  local completor = completor_of(target.bufnr)
  if not completor or completor.current then
    return -- another Neovim, or it has an item again
  end
  local remainder = rest:sub(#part + 1)
  local command = item.command
  if command and lsp_client.is_ours(target.client) then
    command = partial.command_for(command, remainder)
  end
  completor.current = vim.tbl_extend('force', item, {
    insert_text = remainder,
    range = item.range and range_like(item.range, last_row, last_col, end_row, end_col),
    command = command,
    speculative_rest = { tick = api.nvim_buf_get_changedtick(target.bufnr), row = last_row, col = last_col },
  })
  completor:show()
end

--- Accept `take` (partial.word, partial.line) of the item Neovim hands over, at the cursor.
local function accept_part(bufnr, take, item)
  local client = vim.lsp.get_client_by_id(item.client_id)
  local text, range = item.insert_text, item.range
  if not client or type(text) ~= 'string' or api.nvim_get_current_buf() ~= bufnr then
    return -- a snippet: lsp_server sends none
  end
  local cursor = api.nvim_win_get_cursor(0)
  local target = { bufnr = bufnr, item = item, client = client, row = cursor[1] - 1, col = cursor[2] }
  target.finish = { target.row, target.col }
  local typed = ''
  if range then
    if target.row ~= range.start.row or target.col < range.start.col then
      return
    end
    target.finish = { range.end_.row, range.end_.col }
    typed = api.nvim_buf_get_text(bufnr, target.row, range.start.col, target.row, target.col, {})[1]
  end
  if text:sub(1, #typed) ~= typed or #typed == #text then
    return
  end
  local rest = text:sub(#typed + 1)
  local part = take(rest)
  if part == rest or part == '' then
    apply(target) -- what is left is the whole rest: the whole item
  else
    apply_part(target, rest, part)
  end
end

--- Accept the suggestion shown (true when there is one; applied right after), or with `take`
--- (partial.word, partial.line) only that part of what is left of it.
function M.accept(bufnr, take)
  if attached[bufnr] == nil then
    return false
  end
  if not take then
    return vim.lsp.inline_completion.get({ bufnr = bufnr })
  end
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      accept_part(bufnr, take, item)
    end,
  })
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
