-- The plugin's options: defaults, validation, and the resolved ghost-text path.

local M = {}

M.NAME = 'speculative_complete' -- the LSP client's name, the augroups' and the highlight's prefix

M.defaults = {
  -- The server: `cmd` is a program name or a list, `args` is appended to it. Neovim copies the
  -- server's stderr into its LSP log as errors, so only warnings and errors are written there.
  cmd = 'lsp_server',
  args = { '--stdio', '--log-level', 'WARNING' },
  -- Buffers of these filetypes start (or reuse) the one server process.
  filetypes = {
    'python',
    'lua',
    'javascript',
    'javascriptreact',
    'typescript',
    'typescriptreact',
    'go',
    'rust',
    'c',
    'cpp',
    'java',
    'sh',
  },
  -- The server's settings (README, "Settings"): sent as init_options and on workspace/configuration.
  settings = {},
  -- Insert-mode keys, each its usual self when no suggestion is shown; `false` leaves one unmapped
  -- (see require('speculative_complete').accept()). The whole suggestion on Tab and its first line
  -- on Shift-Tab as llama.vim; its next word on Ctrl-Right, VS Code's key for that, a motion by a
  -- word in Insert mode otherwise.
  keymaps = { accept = '<Tab>', accept_word = '<C-Right>', accept_line = '<S-Tab>' },
  -- 'auto': Neovim's own vim.lsp.inline_completion where it exists (0.12+), else 'extmark'.
  -- 'extmark': this plugin's ghost text (any Neovim >= 0.10).
  ghost_text = 'auto',
  -- The extmark path waits this long after the last keystroke before it asks the server.
  debounce_ms = 75,
  -- Suggestions on at start (`:SpeculativeCompleteToggle` flips it).
  enabled = true,
}

local function fail(name, expected, value)
  error(('speculative_complete: option %s must be %s, got %s'):format(name, expected, vim.inspect(value)), 0)
end

local function is_string_list(value)
  if type(value) ~= 'table' then
    return false
  end
  for _, item in ipairs(value) do
    if type(item) ~= 'string' or item == '' then
      return false
    end
  end
  return #value == vim.tbl_count(value) -- a list, not a map
end

--- Whether this Neovim has the native inline completion (0.12+).
function M.has_native()
  return vim.fn.has('nvim-0.12') == 1 and vim.lsp.inline_completion ~= nil
end

--- The defaults overridden by `user` (a table or nil), validated; errors name the bad option.
function M.resolve(user)
  user = user or {}
  if type(user) ~= 'table' then
    fail('setup{}', 'a table', user)
  end
  local names = vim.tbl_keys(M.defaults)
  table.sort(names)
  for key in pairs(user) do
    if M.defaults[key] == nil then
      fail(key, 'one of ' .. table.concat(names, ', '), user[key])
    end
  end

  local config = vim.deepcopy(M.defaults)
  for key, value in pairs(user) do
    if key == 'keymaps' and type(value) == 'table' then
      config.keymaps = vim.tbl_extend('force', config.keymaps, value)
    else
      config[key] = vim.deepcopy(value)
    end
  end

  if type(config.cmd) == 'string' then
    config.cmd = { config.cmd }
  end
  if not is_string_list(config.cmd) or #config.cmd == 0 then
    fail('cmd', 'a program name or a non-empty list of strings', config.cmd)
  end
  if not is_string_list(config.args) then
    fail('args', 'a list of strings', config.args)
  end
  if not is_string_list(config.filetypes) then
    fail('filetypes', 'a list of filetype names', config.filetypes)
  end
  if type(config.settings) ~= 'table' then
    fail('settings', 'a table of the server settings', config.settings)
  end
  if type(config.keymaps) ~= 'table' then
    fail('keymaps', 'a table', config.keymaps)
  end
  local keymap_names = vim.tbl_keys(M.defaults.keymaps)
  table.sort(keymap_names)
  for name, key in pairs(config.keymaps) do
    if M.defaults.keymaps[name] == nil then
      fail('keymaps.' .. name, 'not set (the keymaps are ' .. table.concat(keymap_names, ', ') .. ')', key)
    end
    if key ~= false and (type(key) ~= 'string' or key == '') then
      fail('keymaps.' .. name, 'a key such as "<Tab>", or false', key)
    end
  end
  if not vim.tbl_contains({ 'auto', 'native', 'extmark' }, config.ghost_text) then
    fail('ghost_text', "'auto', 'native' or 'extmark'", config.ghost_text)
  end
  if config.ghost_text == 'native' and not M.has_native() then
    fail('ghost_text', "'auto' or 'extmark' on Neovim < 0.12 (no vim.lsp.inline_completion)", 'native')
  end
  if type(config.debounce_ms) ~= 'number' or config.debounce_ms < 0 then
    fail('debounce_ms', 'a number >= 0', config.debounce_ms)
  end
  if type(config.enabled) ~= 'boolean' then
    fail('enabled', 'true or false', config.enabled)
  end

  config.path = config.ghost_text
  if config.path == 'auto' then
    config.path = M.has_native() and 'native' or 'extmark'
  end
  return config
end

--- The full command line of the server.
function M.command(config)
  local command = vim.list_extend({}, config.cmd)
  return vim.list_extend(command, config.args)
end

return M
