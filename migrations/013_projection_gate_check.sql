-- A projection batch in one round trip (issue #12). The runner sends its
-- usual batch (the projection's shared lock, the positions, the inbox
-- rows, the read-model writes, the positions' advance) as one pipeline
-- that PostgreSQL runs as one implicit transaction, on the premise that
-- the batch is the common case: every event new and next in line for its
-- order. Two statements check the premise with this function; when it
-- does not hold (a redelivery, an event whose predecessor is still in
-- flight), it raises, the implicit transaction rolls back with nothing
-- written, and the runner applies the batch the careful way
-- (projection/gate.go).
CREATE FUNCTION projection_gate_check(ok boolean, premise text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'projection batch: %', premise USING ERRCODE = 'PJ001';
    END IF;
    RETURN true;
END
$$;

---- create above / drop below ----

DROP FUNCTION projection_gate_check(boolean, text);
