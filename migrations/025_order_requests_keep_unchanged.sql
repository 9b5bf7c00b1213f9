-- Keys of pays and refunds answered 200 (they changed nothing) are kept
-- too: the api keeps those answered while another key's attempt or refund
-- was under way from this release on (command/order_requests.go), and 024
-- kept only the 202s, so a retry of such a key after its row expired, once
-- that attempt was declined or that refund failed, started an attempt the
-- first run had not. Which of them were answered while something was under
-- way cannot be told here, so every one is kept: at most the live keys, a
-- day's. The version is the one its stored ETag names, the order's when it
-- ran, as the api keeps it; 024's filters and its exemption from the
-- statement timeout, for the same reasons.
SET LOCAL statement_timeout = 0;
INSERT INTO order_requests (tenant_id, order_id, scope, idempotency_key, version)
SELECT k.tenant_id, (k.request->>'order_id')::uuid,
       CASE k.scope WHEN 'POST /v1/orders/{id}/pay' THEN 'pay' ELSE 'refund' END,
       k.key,
       substring(k.response_headers->>'ETag' FROM '^"([0-9]{1,18})"$')::bigint
FROM idempotency_keys k
WHERE k.scope IN ('POST /v1/orders/{id}/pay', 'POST /v1/orders/{id}/refund') AND k.status_code = 200
  AND jsonb_typeof(k.request) = 'object'
  AND k.request->>'order_id' ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
  AND jsonb_typeof(k.response_headers) = 'object'
  AND k.response_headers->>'ETag' ~ '^"[0-9]{1,18}"$'
ON CONFLICT DO NOTHING;

---- create above / drop below ----

-- Nothing to undo: the rows kept are what the api would have written.
