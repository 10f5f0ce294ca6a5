-- Partial accept, shared by both ghost-text paths: which part of a suggestion's rest the next word
-- or line is, inserting it at the cursor, and where the suggestion's range ends after that.

local api = vim.api
local M = {}

-- A word: letters, digits, `_`, and any byte of a multi-byte character (so `é` or `名` is a letter).
local WORD = '^[%w_\128-\255]+'
local PUNCTUATION = '^[^%w_%s\128-\255]+'

--- What accept-word takes from `rest`: its leading whitespace (line breaks included) and then one
--- word or one run of punctuation, so every key inserts something visible (VS Code's acceptNextWord
--- takes ` ` alone before `= y`, then `= `).
function M.word(rest)
  local space = rest:match('^%s*')
  local after = rest:sub(#space + 1)
  local token = after:match(WORD) or after:match(PUNCTUATION) or ''
  return rest:sub(1, #space + #token)
end

--- What accept-line takes from `rest`: up to the end of its first line, without the line break,
--- so the cursor stays on the line; a rest that starts with a line break gives it and the next line.
function M.line(rest)
  local lead = rest:sub(1, 1) == '\n' and '\n' or ''
  return lead .. rest:sub(#lead + 1):match('^[^\n]*')
end

--- Insert `text` at {row, col} (0-based) of the current window's buffer and put the cursor after
--- it; the {row, col} where it ends.
function M.insert(bufnr, row, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local last_row = row + #lines - 1
  local last_col = #lines == 1 and col + #lines[1] or #lines[#lines]
  api.nvim_win_set_cursor(0, { last_row + 1, last_col })
  return last_row, last_col
end

--- Where a position after {row, col} is once `text` is inserted at {row, col} (0-based).
function M.shift(pos_row, pos_col, row, col, text)
  local lines = vim.split(text, '\n', { plain = true })
  if pos_row ~= row then
    return pos_row + #lines - 1, pos_col
  end
  local last_col = #lines == 1 and col + #lines[1] or #lines[#lines]
  return row + #lines - 1, last_col + pos_col - col
end

--- The item's command, telling the server that only `text` was accepted (lsp_server's accepted
--- command takes the document's URI and the text).
function M.command_for(command, text)
  if type(command) ~= 'table' or type(command.arguments) ~= 'table' then
    return nil
  end
  return { title = command.title, command = command.command, arguments = { command.arguments[1], text } }
end

return M
