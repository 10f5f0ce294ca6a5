-- Human-readable lines from the server's `lsp_server/stats` answer.

local M = {}

local function ms(value)
  if type(value) ~= 'number' then
    return '-'
  end
  return ('%d ms'):format(math.floor(value + 0.5))
end

--- One line about the model: status, what, where, how long it took to load.
function M.model(model)
  model = type(model) == 'table' and model or {}
  local status = model.status or 'unknown'
  if status == 'ready' then
    local load = type(model.load_ms) == 'number' and (', loaded in %.1f s'):format(model.load_ms / 1000) or ''
    return ('model ready: %s (%s, %s%s)'):format(
      model.spec or '?',
      model.device or '?',
      model.dtype or '?',
      load
    )
  elseif status == 'failed' then
    return ('model failed to load: %s'):format(model.error or 'unknown error')
  end
  return ('model %s: %s'):format(status, model.spec or '?')
end

--- The summary shown by :SpeculativeCompleteStats.
function M.stats(stats, last_latency_ms)
  local latency = type(stats.latency_ms) == 'table' and stats.latency_ms or {}
  local lines = {
    ('lsp_server %s, %s'):format(stats.version or '?', M.model(stats.model)),
    ('requests %d: answered %d, empty %d, cancelled %d, superseded %d, failed %d, errors %d'):format(
      stats.requests or 0,
      stats.answered or 0,
      stats.empty or 0,
      stats.cancelled or 0,
      stats.superseded or 0,
      stats.failed or 0,
      stats.errors or 0
    ),
    ('latency p50 %s, p95 %s; last seen by this editor %s'):format(
      ms(latency.p50),
      ms(latency.p95),
      ms(last_latency_ms)
    ),
  }
  if type(stats.tokens_per_pass) == 'number' then
    lines[#lines + 1] = ('tokens per target pass %.2f'):format(stats.tokens_per_pass)
  end
  for name, per in pairs(type(stats.drafters) == 'table' and stats.drafters or {}) do
    lines[#lines + 1] = ('drafter %s: %d of %d proposed tokens accepted'):format(
      name,
      per.accepted or 0,
      per.proposed or 0
    )
  end
  return lines
end

M.ms = ms

return M
