-- An order's items live in the order's row, as a jsonb array in line order
-- ([{"sku", "quantity", "unit_price", "line_total"}, …]), not in a table of
-- their own (#12 item 3). Items never change after the create, nothing
-- queries one item, and every reader wants all of them with the order.
-- A table cost every create a fourth ModifyTable (its executor set-up), a
-- primary-key entry and a foreign-key check through SPI per item, and a
-- heap tuple per item (perf of the create: together about a fifth of its
-- PostgreSQL CPU). Domain validation (domain.NewOrder) bounds the values;
-- the CHECK keeps the shape.
ALTER TABLE orders ADD COLUMN items jsonb;
UPDATE orders o SET items = (
    SELECT jsonb_agg(jsonb_build_object('sku', i.sku, 'quantity', i.quantity, 'unit_price', i.unit_price,
                                        'line_total', i.line_total) ORDER BY i.line_no)
    FROM order_items i WHERE i.tenant_id = o.tenant_id AND i.order_id = o.id);
UPDATE orders SET items = '[]' WHERE items IS NULL;
ALTER TABLE orders ALTER COLUMN items SET NOT NULL,
    ADD CONSTRAINT orders_items_array CHECK (jsonb_typeof(items) = 'array');
DROP TABLE order_items;

---- create above / drop below ----

CREATE TABLE order_items (
    tenant_id  text    NOT NULL,
    order_id   uuid    NOT NULL,
    line_no    integer NOT NULL,
    sku        text    NOT NULL,
    quantity   bigint  NOT NULL CHECK (quantity > 0),
    unit_price bigint  NOT NULL CHECK (unit_price >= 0),
    line_total bigint  NOT NULL CHECK (line_total >= 0),
    PRIMARY KEY (tenant_id, order_id, line_no),
    FOREIGN KEY (tenant_id, order_id) REFERENCES orders (tenant_id, id)
);
INSERT INTO order_items (tenant_id, order_id, line_no, sku, quantity, unit_price, line_total)
SELECT o.tenant_id, o.id, i.line_no, i.item->>'sku', (i.item->>'quantity')::bigint,
       (i.item->>'unit_price')::bigint, (i.item->>'line_total')::bigint
FROM orders o, jsonb_array_elements(o.items) WITH ORDINALITY AS i(item, line_no);
ALTER TABLE orders DROP COLUMN items;
