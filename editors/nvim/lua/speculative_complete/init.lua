-- speculative_complete: whole-line ghost-text suggestions from `lsp_server --stdio`.
--
--   require('speculative_complete').setup({ settings = { maxNewTokens = 48 } })
--
-- setup() starts the server for the configured filetypes (one process for the whole editor) and,
-- in each buffer it attaches to, shows its suggestions as ghost text: Neovim's own
-- vim.lsp.inline_completion on 0.12+, the plugin's extmarks on 0.10/0.11 (or ghost_text =
-- 'extmark'). The accept key (Tab) inserts the suggestion, or is a plain Tab when none is shown;
-- accept_word (<C-Right>) and accept_line (<S-Tab>) insert its next word or the rest of its line.

local config_mod = require('speculative_complete.config')
local lsp_client = require('speculative_complete.client')
local partial = require('speculative_complete.partial')

local api = vim.api
local M = {}

M.config = nil ---@type table? the resolved options, once setup() ran
M.enabled = true
M.start_error = nil ---@type string? why the server could not be started

local function path_module()
  return require('speculative_complete.' .. (M.config.path == 'native' and 'native' or 'ghost'))
end

local function notify(message, level)
  vim.notify('speculative_complete: ' .. message, level or vim.log.levels.INFO)
end

local function capabilities()
  local caps = vim.lsp.protocol.make_client_capabilities()
  -- Byte offsets: Neovim's native unit, no conversion on either side.
  caps.general = caps.general or {}
  caps.general.positionEncodings = { 'utf-8', 'utf-16', 'utf-32' }
  return caps
end

--- The vim.lsp.start() configuration of the server.
function M.client_config(config)
  -- An empty Lua table is a JSON list: the server wants an object.
  local settings = next(config.settings) and config.settings or vim.empty_dict()
  return {
    name = config_mod.NAME,
    cmd = config_mod.command(config),
    init_options = { lspServer = settings },
    settings = { lspServer = settings }, -- answers the server's workspace/configuration
    capabilities = capabilities(),
  }
end

--- Start the server for `bufnr`, or attach the running one to it.
function M.start(bufnr)
  local config = M.config
  if not config then
    return
  end
  local command = config_mod.command(config)
  if vim.fn.executable(command[1]) == 0 then
    if not M.start_error then -- say it once, not for every buffer
      M.start_error = ('server command not found: %s (install lsp-speculative-complete, or set cmd)'):format(
        command[1]
      )
      notify(M.start_error .. '; see :checkhealth speculative_complete', vim.log.levels.WARN)
    end
    return
  end
  M.start_error = nil
  vim.lsp.start(M.client_config(config), {
    bufnr = bufnr,
    reuse_client = function(client)
      return client.name == config_mod.NAME -- one model in memory, whatever the root
    end,
  })
end

local function accept_with(bufnr, take)
  if not M.config then
    return false
  end
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  return path_module().accept(bufnr, take) == true
end

--- Accept the suggestion shown in `bufnr` (default: current). True when one will be inserted.
function M.accept(bufnr)
  return accept_with(bufnr, nil)
end

--- Insert the next word of the suggestion shown (its leading whitespace, then one word or one run
--- of punctuation); the rest stays shown. True when there is a suggestion.
function M.accept_word(bufnr)
  return accept_with(bufnr, partial.word)
end

--- Insert the rest of the suggestion's first line (a line break and the next line when it starts
--- with one); the rest stays shown. True when there is a suggestion.
function M.accept_line(bufnr)
  return accept_with(bufnr, partial.line)
end

local MAPPINGS = { -- keymaps name -> what the key does, and its description
  accept = { M.accept, 'Accept the speculative_complete suggestion' },
  accept_word = { M.accept_word, 'Accept the next word of the speculative_complete suggestion' },
  accept_line = { M.accept_line, 'Accept the next line of the speculative_complete suggestion' },
}

--- `key` does `name`'s action when a suggestion is shown, and what it always does otherwise.
local function map(bufnr, name, key)
  local action, desc = unpack(MAPPINGS[name])
  vim.keymap.set('i', key, function()
    if action(bufnr) then
      return ''
    end
    return key
  end, { buffer = bufnr, expr = true, desc = desc })
end

local function on_attach(bufnr, client)
  path_module().attach(bufnr, client)
  for name, key in pairs(M.config.keymaps) do
    if key then
      map(bufnr, name, key)
    end
  end
end

function M.set_enabled(flag)
  M.enabled = flag
  path_module().set_enabled(flag)
end

function M.toggle()
  if not M.config then
    return notify('call setup() first', vim.log.levels.WARN)
  end
  M.set_enabled(not M.enabled)
  notify('suggestions ' .. (M.enabled and 'on' or 'off'))
end

--- Ask the server for its counters; `callback(err, stats)` runs later, never blocks.
function M.stats(callback)
  local client = lsp_client.get()
  if not client then
    return callback('the server is not running', nil)
  end
  lsp_client.call(client, 'request', lsp_client.STATS, vim.empty_dict(), function(err, result)
    callback(err and (err.message or tostring(err)) or nil, result)
  end, api.nvim_get_current_buf())
end

function M.show_stats()
  M.stats(function(err, stats)
    if err then
      return notify(err, vim.log.levels.WARN)
    end
    local lines = require('speculative_complete.format').stats(stats, lsp_client.last_latency_ms)
    notify(table.concat(lines, '\n'))
  end)
end

function M.setup(opts)
  local config = config_mod.resolve(opts)
  M.config = config
  M.enabled = config.enabled
  path_module().configure(config)
  api.nvim_set_hl(0, require('speculative_complete.ghost').HIGHLIGHT, { link = 'Comment', default = true })

  local group = api.nvim_create_augroup(config_mod.NAME, { clear = true })
  api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = config.filetypes,
    callback = function(args)
      M.start(args.buf)
    end,
  })
  api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if lsp_client.is_ours(client) then
        on_attach(args.buf, client)
      end
    end,
  })
  api.nvim_create_autocmd('LspRequest', { group = group, callback = lsp_client.track })
  -- An editor asks only when the user types: what was typed while the model loaded got an empty
  -- answer, so when the load ends the cursor's position is asked about again.
  api.nvim_create_autocmd('LspProgress', {
    group = group,
    pattern = 'end',
    callback = function(args)
      if M.enabled and lsp_client.is_load_end(args.data) then
        vim.schedule(function()
          path_module().reask(api.nvim_get_current_buf())
        end)
      end
    end,
  })
  api.nvim_create_autocmd('ColorScheme', {
    group = group,
    callback = function()
      api.nvim_set_hl(
        0,
        require('speculative_complete.ghost').HIGHLIGHT,
        { link = 'Comment', default = true }
      )
    end,
  })
  -- Buffers opened before setup() (a lazy-loading plugin manager) get the server too.
  for _, bufnr in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_is_loaded(bufnr) and vim.tbl_contains(config.filetypes, vim.bo[bufnr].filetype) then
      M.start(bufnr)
    end
  end
end

return M
