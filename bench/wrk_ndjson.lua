-- 100 NDJSON events per request.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-ndjson"
local lines = {}
for i = 1, 100 do
  lines[i] = string.format('{"id":"evt_%06d","type":"charge.succeeded","ts":"2026-11-29T15:01:00.123Z","amount":%d,"currency":"usd"}', i, i * 7)
end
wrk.body = table.concat(lines, "\n")
