-- Commands only; nothing starts until require('speculative_complete').setup() is called.
if vim.g.loaded_speculative_complete then
  return
end
vim.g.loaded_speculative_complete = true

vim.api.nvim_create_user_command('SpeculativeCompleteToggle', function()
  require('speculative_complete').toggle()
end, { desc = 'Turn speculative_complete suggestions off or on' })

vim.api.nvim_create_user_command('SpeculativeCompleteStats', function()
  require('speculative_complete').show_stats()
end, { desc = "Show lsp_server's counters: model, requests, latency" })
