-- Money sums of the read models are numeric(38,0): exact integers up to
-- 10^38 - 1 minor units. As bigint they overflowed ("bigint out of range")
-- once the amounts of a customer or a day passed 2^63, which orders placed
-- before domain.MaxAmount (10^12 per order) can do with two orders. With the
-- bound, 2^63 would still be 9.2 million maximal orders away; numeric makes
-- the sums exact whatever the history, and PostgreSQL checks their range
-- (22003 numeric_value_out_of_range past 10^38 - 1) instead of wrapping.
-- Single amounts (orders.total, order_items, order_views.total) stay bigint:
-- the domain bounds them.
ALTER TABLE customer_summaries
    ALTER COLUMN total_paid     TYPE numeric(38,0),
    ALTER COLUMN total_refunded TYPE numeric(38,0);
ALTER TABLE daily_sales
    ALTER COLUMN paid_amount     TYPE numeric(38,0),
    ALTER COLUMN refunded_amount TYPE numeric(38,0);

---- create above / drop below ----

-- Fails with "bigint out of range" if a sum has passed 2^63 - 1.
ALTER TABLE daily_sales
    ALTER COLUMN paid_amount     TYPE bigint,
    ALTER COLUMN refunded_amount TYPE bigint;
ALTER TABLE customer_summaries
    ALTER COLUMN total_paid     TYPE bigint,
    ALTER COLUMN total_refunded TYPE bigint;
