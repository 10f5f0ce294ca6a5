-- Ghost text drawn by the plugin itself (Neovim 0.10 and 0.11, or ghost_text = 'extmark'):
-- its own textDocument/inlineCompletion requests, debounced, the previous one cancelled at every
-- keystroke, and an answer drawn as an extmark only while the buffer, the cursor and the mode are
-- exactly what the request was made for. Cleared on InsertLeave.

local lsp_client = require('speculative_complete.client')
local partial = require('speculative_complete.partial')

local api = vim.api
local M = {}

M.namespace = api.nvim_create_namespace('speculative_complete.ghost')
M.HIGHLIGHT = 'SpeculativeCompleteGhost'
M.last_error = nil ---@type string? the last error the server answered, for :checkhealth

local options = { debounce_ms = 75, enabled = true }

---@class speculative_complete.Snapshot
---@field tick integer b:changedtick
---@field row integer 0-based cursor line
---@field col integer 0-based cursor byte column

---@class speculative_complete.Shown
---@field snap speculative_complete.Snapshot
---@field start integer[] {row, col} of the text to replace (0-based, bytes)
---@field finish integer[] {row, col} where the replaced text ends
---@field text string what start..finish becomes
---@field command lsp.Command? run when it is accepted

---@class speculative_complete.Buffer
---@field client_id integer
---@field timer uv.uv_timer_t the debounce
---@field seq integer bumped by every request and cancel: answers with an older one are ignored
---@field request_id integer? the request in flight
---@field shown speculative_complete.Shown? the suggestion drawn now
---@field group integer the buffer's augroup

---@type table<integer, speculative_complete.Buffer>
local buffers = {}

--- The state a request is made for; nil unless in Insert mode in `bufnr`'s window.
---@return speculative_complete.Snapshot?
local function snapshot(bufnr)
  if api.nvim_get_current_buf() ~= bufnr or api.nvim_get_mode().mode:sub(1, 1) ~= 'i' then
    return nil
  end
  local cursor = api.nvim_win_get_cursor(0)
  return { tick = api.nvim_buf_get_changedtick(bufnr), row = cursor[1] - 1, col = cursor[2] }
end

local function still(bufnr, snap)
  local now = snapshot(bufnr)
  return now ~= nil and now.tick == snap.tick and now.row == snap.row and now.col == snap.col
end

--- A position's byte column in `line`, from `character` in the negotiated encoding.
local function byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if vim.fn.has('nvim-0.11') == 1 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and col or #line
end

local function line_at(bufnr, row)
  return api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
end

function M.clear(bufnr)
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
  if buffers[bufnr] then
    buffers[bufnr].shown = nil
  end
end

--- What an item would show at `snap`, or nil when it does not fit there (another line, or text
--- already typed after its start that it does not begin with).
---@return speculative_complete.Shown?, string?
local function fit(bufnr, snap, item, encoding)
  local text = item.insertText
  if type(text) ~= 'string' or text == '' then
    return nil -- snippets (a table) are not offered by lsp_server; skip them rather than garble
  end
  local line = line_at(bufnr, snap.row)
  local start, finish = { snap.row, snap.col }, { snap.row, snap.col }
  if item.range then
    local s, e = item.range.start, item.range['end']
    start = { s.line, byte_col(line_at(bufnr, s.line), s.character, encoding) }
    finish = { e.line, byte_col(line_at(bufnr, e.line), e.character, encoding) }
  end
  if start[1] ~= snap.row or start[2] > snap.col then
    return nil
  end
  local typed = line:sub(start[2] + 1, snap.col)
  if text:sub(1, #typed) ~= typed or #text == #typed then
    return nil
  end
  local shown = { snap = snap, start = start, finish = finish, text = text, command = item.command }
  return shown, text:sub(#typed + 1)
end

local function show(bufnr, shown, rest)
  local lines = vim.split(rest, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], M.HIGHLIGHT } }
  end
  local replaces = shown.finish[1] > shown.snap.row or shown.finish[2] > shown.snap.col
  api.nvim_buf_set_extmark(bufnr, M.namespace, shown.snap.row, shown.snap.col, {
    virt_text = { { lines[1], M.HIGHLIGHT } },
    virt_text_pos = replaces and 'overlay' or 'inline', -- overlay: the text it replaces is hidden
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
  buffers[bufnr].shown = shown
end

local function on_answer(bufnr, seq, snap, encoding, err, result)
  local state = buffers[bufnr]
  if not state or state.seq ~= seq then
    return -- superseded by a newer request, dismissed, or detached
  end
  state.request_id = nil
  if err then
    M.last_error = err.message or tostring(err)
    return
  end
  if not still(bufnr, snap) then
    return
  end
  local items = result and (result.items or result) or {}
  if items[1] then
    local shown, rest = fit(bufnr, snap, items[1], encoding)
    if shown then
      show(bufnr, shown, rest)
    end
  end
end

local function request(bufnr)
  local state = buffers[bufnr]
  local client = state and vim.lsp.get_client_by_id(state.client_id)
  local snap = snapshot(bufnr)
  if not client or not snap or not options.enabled then
    return
  end
  local encoding = client.offset_encoding
  local params = vim.lsp.util.make_position_params(0, encoding)
  params.context = { triggerKind = 2 } -- Automatic
  state.seq = state.seq + 1
  local seq = state.seq
  local ok, id = lsp_client.call(client, 'request', lsp_client.INLINE, params, function(err, result)
    on_answer(bufnr, seq, snap, encoding, err, result)
  end, bufnr)
  state.request_id = ok and id or nil
end

--- Forget the request in flight: cancel it at the server, ignore its answer.
local function cancel(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  state.seq = state.seq + 1
  local client = state.request_id and vim.lsp.get_client_by_id(state.client_id)
  if client then
    lsp_client.call(client, 'cancel_request', state.request_id)
  end
  state.request_id = nil
end

--- Hide the suggestion, cancel the request, stop the debounce timer.
function M.dismiss(bufnr)
  local state = buffers[bufnr]
  if state then
    state.timer:stop()
    cancel(bufnr)
    M.clear(bufnr)
  end
end

local function on_change(bufnr)
  local state = buffers[bufnr]
  if state and state.shown and still(bufnr, state.shown.snap) then
    return -- the change was the plugin's own partial accept: the rest shown is still right
  end
  M.dismiss(bufnr)
  if state and options.enabled then
    state.timer:start(
      options.debounce_ms,
      0,
      vim.schedule_wrap(function()
        request(bufnr)
      end)
    )
  end
end

function M.detach(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  M.dismiss(bufnr)
  state.timer:close()
  pcall(api.nvim_del_augroup_by_id, state.group)
  buffers[bufnr] = nil
end

function M.attach(bufnr, client)
  if buffers[bufnr] then
    buffers[bufnr].client_id = client.id
    return
  end
  local group = api.nvim_create_augroup('speculative_complete.ghost.' .. bufnr, { clear = true })
  buffers[bufnr] = { client_id = client.id, timer = assert(vim.uv.new_timer()), seq = 0, group = group }
  api.nvim_create_autocmd({ 'InsertEnter', 'TextChangedI', 'TextChangedP', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      on_change(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.dismiss(bufnr)
    end,
  })
  api.nvim_create_autocmd('LspDetach', {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.data and args.data.client_id == client.id then
        M.detach(bufnr)
      end
    end,
  })
  api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.detach(bufnr)
    end,
  })
end

--- Ask again where the cursor is (the model just became ready), if `bufnr` is in Insert mode.
function M.reask(bufnr)
  if buffers[bufnr] and options.enabled and snapshot(bufnr) then
    M.dismiss(bufnr)
    request(bufnr)
  end
end

local function run_command(bufnr, command)
  local client = command and vim.lsp.get_client_by_id(buffers[bufnr].client_id)
  if client then
    lsp_client.execute(client, bufnr, command)
  end
end

--- The whole suggestion: start..finish becomes its text, then its command runs.
local function apply(bufnr, shown)
  M.dismiss(bufnr)
  local lines = vim.split(shown.text, '\n', { plain = true })
  local start, finish = shown.start, shown.finish
  api.nvim_buf_set_text(bufnr, start[1], start[2], finish[1], finish[2], lines)
  local last = #lines == 1 and start[2] + #lines[1] or #lines[#lines]
  api.nvim_win_set_cursor(0, { start[1] + #lines, last })
  run_command(bufnr, shown.command)
end

--- `part` of the rest `rest` inserted at the cursor, the server told of it alone, and the rest of
--- the rest shown as the suggestion now there (its own command tells of that rest only).
local function apply_part(bufnr, shown, rest, part)
  M.dismiss(bufnr)
  local row, col = shown.snap.row, shown.snap.col
  local end_row, end_col = partial.shift(shown.finish[1], shown.finish[2], row, col, part)
  local last_row, last_col = partial.insert(bufnr, row, col, part)
  run_command(bufnr, partial.command_for(shown.command, part))
  local remainder = rest:sub(#part + 1)
  local snap = snapshot(bufnr)
  if snap and snap.row == last_row and snap.col == last_col then
    show(bufnr, {
      snap = snap,
      start = { last_row, last_col },
      finish = { end_row, end_col },
      text = remainder,
      command = partial.command_for(shown.command, remainder),
    }, remainder)
  end
end

--- Accept the suggestion shown in `bufnr`, or with `take` (partial.word, partial.line) only that
--- part of what is left of it: true when there is one (it is applied right after, so this can run
--- inside an <expr> mapping), false when there is nothing to accept.
function M.accept(bufnr, take)
  local state = buffers[bufnr]
  local shown = state and state.shown
  if not shown or not still(bufnr, shown.snap) then
    return false
  end
  vim.schedule(function()
    if not buffers[bufnr] or buffers[bufnr].shown ~= shown or not still(bufnr, shown.snap) then
      return
    end
    local typed = shown.snap.col - shown.start[2] -- fit() checked the text begins with it
    local rest = shown.text:sub(typed + 1)
    local part = take and take(rest) or rest
    if part == rest or part == '' then
      apply(bufnr, shown) -- what is left is the whole rest: the whole suggestion
    else
      apply_part(bufnr, shown, rest, part)
    end
  end)
  return true
end

--- The text of the suggestion shown in `bufnr` (from its start), or nil.
function M.current(bufnr)
  local state = buffers[bufnr]
  return state and state.shown and state.shown.text or nil
end

function M.configure(opts)
  options.debounce_ms = opts.debounce_ms
  M.set_enabled(opts.enabled)
end

function M.set_enabled(enabled)
  options.enabled = enabled
  if not enabled then
    for bufnr in pairs(buffers) do
      M.dismiss(bufnr)
    end
  end
end

return M
