-- :checkhealth speculative_complete: Neovim, the server command, the model, the last latency.

local config_mod = require('speculative_complete.config')
local format = require('speculative_complete.format')
local lsp_client = require('speculative_complete.client')

local health = vim.health
local M = {}

local STATS_TIMEOUT_MS = 2000

local function check_server(plugin)
  local command = config_mod.command(plugin.config)
  local path = vim.fn.exepath(command[1])
  if path == '' then
    health.error(('server command not found: %s'):format(command[1]), {
      'pip install the project (it provides `lsp_server`), then restart Neovim',
      "or point setup{ cmd = ... } at it, e.g. cmd = { '/path/to/venv/bin/lsp_server' }",
    })
    return false
  end
  health.ok(('server command: %s (%s)'):format(table.concat(command, ' '), path))
  return true
end

local function check_model(client)
  local answer, err = lsp_client.call(
    client,
    'request_sync',
    lsp_client.STATS,
    vim.empty_dict(),
    STATS_TIMEOUT_MS,
    vim.api.nvim_get_current_buf()
  )
  if not answer or answer.err then
    health.warn(
      ('the server did not answer %s: %s'):format(
        lsp_client.STATS,
        tostring(err or (answer and answer.err and answer.err.message))
      )
    )
    return nil
  end
  local stats = answer.result or {}
  local status = (stats.model or {}).status
  if status == 'ready' then
    health.ok(format.model(stats.model))
  elseif status == 'failed' then
    health.error(
      format.model(stats.model),
      { 'fix the `model` setting; the server reloads it when it changes' }
    )
  else
    health.warn(
      format.model(stats.model),
      { 'the first start converts the model once (about 30 s); wait and re-run' }
    )
  end
  return stats
end

local function check_latency(stats)
  local latency = stats and type(stats.latency_ms) == 'table' and stats.latency_ms or {}
  if lsp_client.last_latency_ms then
    health.ok(
      ('last suggestion latency: %s (server p50 %s, p95 %s over %d answers)'):format(
        format.ms(lsp_client.last_latency_ms),
        format.ms(latency.p50),
        format.ms(latency.p95),
        stats and stats.answered or 0
      )
    )
  else
    health.info('no suggestion requested yet: type in Insert mode in a supported buffer')
  end
end

function M.check()
  health.start('speculative_complete')
  local plugin = require('speculative_complete')
  if not plugin.config then
    health.warn(
      'setup() has not been called',
      { "add require('speculative_complete').setup() to your config" }
    )
    return
  end
  if vim.fn.has('nvim-0.10') == 0 then
    health.error('Neovim 0.10 or newer is needed')
  end
  local path = plugin.config.path == 'native' and "Neovim's vim.lsp.inline_completion"
    or "the plugin's extmarks"
  health.ok(('ghost text: %s; suggestions %s'):format(path, plugin.enabled and 'on' or 'off (toggled)'))
  if
    plugin.config.path == 'native'
    and lsp_client.get()
    and not require('speculative_complete.native').guarded()
  then
    health.warn("this Neovim's inline completion could not be guarded against late answers", {
      "set ghost_text = 'extmark' if suggestions for text you already changed show up",
    })
  end
  if not check_server(plugin) then
    return
  end
  local client = lsp_client.get()
  if not client then
    health.warn('the server is not running', {
      'it starts with the first buffer of filetype ' .. table.concat(plugin.config.filetypes, ', '),
    })
    return
  end
  health.ok(('server running (client id %d, %s positions)'):format(client.id, client.offset_encoding))
  local stats = check_model(client)
  check_latency(stats)
  local ghost_error = require('speculative_complete.ghost').last_error
  if ghost_error then
    health.warn('the last request failed: ' .. ghost_error)
  end
end

return M
