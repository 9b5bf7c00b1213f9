-- Keys of pays, updates and refunds stored before order_requests existed
-- (021, 023), i.e. by the release before, are kept too: without them a
-- retry of such a key after its row expired ran again (a pay of a declined
-- order started a second charge attempt) or was told 412 for an update that
-- had happened, and that 412 was stored under the key. The version the
-- request made is read from its stored ETag ("N"); a row without one it can
-- read is left out rather than guessed. Plain SQL, one statement: no
-- exception blocks, whose subtransactions would slow every other session's
-- snapshots while it runs. It reads every key row (about 6 s a million
-- here), so it is exempt from the pool's 60 s statement_timeout: cancelled,
-- it would roll back and fail every start again.
SET LOCAL statement_timeout = 0;
INSERT INTO order_requests (tenant_id, order_id, scope, idempotency_key, version)
SELECT k.tenant_id, (k.request->>'order_id')::uuid,
       CASE k.scope WHEN 'POST /v1/orders/{id}/pay' THEN 'pay'
                    WHEN 'POST /v1/orders/{id}/refund' THEN 'refund'
                    ELSE 'update' END,
       k.key,
       substring(k.response_headers->>'ETag' FROM '^"([0-9]{1,18})"$')::bigint
FROM idempotency_keys k
WHERE ((k.scope IN ('POST /v1/orders/{id}/pay', 'POST /v1/orders/{id}/refund') AND k.status_code = 202)
       OR (k.scope = 'PATCH /v1/orders/{id}' AND k.status_code = 200))
  AND jsonb_typeof(k.request) = 'object'
  AND k.request->>'order_id' ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
  AND jsonb_typeof(k.response_headers) = 'object'
  AND k.response_headers->>'ETag' ~ '^"[0-9]{1,18}"$'
ON CONFLICT DO NOTHING;

---- create above / drop below ----

-- Nothing to undo: the rows kept are what 021 would have written.
