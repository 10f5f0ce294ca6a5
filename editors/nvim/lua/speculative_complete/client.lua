-- The LSP client of the plugin: finding it, calling it on every supported Neovim, and what it
-- measured (the latency of the last suggestion request).

local config = require('speculative_complete.config')

local M = {}

local has_method_calls = vim.fn.has('nvim-0.11') == 1 -- 0.10's client methods take no self

M.INLINE = 'textDocument/inlineCompletion'
M.STATS = 'lsp_server/stats'
M.REQUEST_CANCELLED = -32800
M.LOAD_PROGRESS = 'lsp_server/load/' -- the prefix of the server's model-load work-done tokens

--- client:method(...) on 0.11+, client.method(...) on 0.10.
function M.call(client, method, ...)
  if has_method_calls then
    return client[method](client, ...)
  end
  return client[method](...)
end

function M.is_ours(client)
  return client ~= nil and client.name == config.NAME
end

--- The running client, or nil.
function M.get()
  return vim.lsp.get_clients({ name = config.NAME })[1]
end

--- Whether an LspProgress event's data is the end of a model load by the plugin's server: the
--- moment suggestions refused while the model was loading become possible.
function M.is_load_end(data)
  local params = type(data) == 'table' and data.params or {}
  local token, value = params.token, params.value
  return type(token) == 'string'
    and token:sub(1, #M.LOAD_PROGRESS) == M.LOAD_PROGRESS
    and type(value) == 'table'
    and value.kind == 'end'
    and M.is_ours(vim.lsp.get_client_by_id(data.client_id))
end

--- Run an item's command at the server (lsp_server's `lsp_server.accepted` feeds accepted text back
--- to its drafter), as Neovim 0.12's own inline completion does after inserting an item.
function M.execute(client, bufnr, command)
  local params = { command = command.command, arguments = command.arguments }
  M.call(client, 'request', 'workspace/executeCommand', params, function() end, bufnr)
end

--- Cancel the client's pending inline-completion requests for `bufnr`.
function M.cancel_inline(client, bufnr)
  for id, request in pairs(client.requests or {}) do
    if request.type == 'pending' and request.bufnr == bufnr and request.method == M.INLINE then
      M.call(client, 'cancel_request', id)
    end
  end
end

-- Latency of inline-completion requests, measured from Neovim's LspRequest events, so it covers
-- both ghost-text paths: sent ('pending') -> answered ('complete'); cancelled ones don't count.
local sent_at = {} ---@type table<integer, number>
M.last_latency_ms = nil ---@type number?
M.answered = 0

function M.track(event)
  local data = event.data or {}
  local request = data.request or {}
  if request.method ~= M.INLINE or not M.is_ours(vim.lsp.get_client_by_id(data.client_id)) then
    return
  end
  local id = data.request_id
  if request.type == 'pending' then
    sent_at[id] = vim.uv.hrtime()
  elseif request.type == 'complete' and sent_at[id] then
    M.last_latency_ms = (vim.uv.hrtime() - sent_at[id]) / 1e6
    M.answered = M.answered + 1
    sent_at[id] = nil
  else
    sent_at[id] = nil
  end
end

return M
