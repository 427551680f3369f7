-- One JSON event per request.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"id":"evt_1NrA2KLkdIwHu7ix","type":"charge.succeeded","ts":"2026-11-29T15:01:00.123Z","amount":4200,"currency":"usd"}'
