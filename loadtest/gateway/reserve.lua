-- reserve.lua: the gateway's whole stock logic, one EVALSHA per order, as
-- an OpenResty "seckill gateway" does it: check, decrement, number the
-- order. Nothing else is kept: no order record, no idempotency, no
-- per-user tally, no generation -- which is exactly what the flashsale
-- service adds, and what this reference lets a user price.
--
-- KEYS[1] gw:{<sku>}:stock   KEYS[2] gw:{<sku>}:seq   ARGV[1] quantity
-- Returns {units left, order number}, or {-1, units available} when short
-- (-1, -1: unknown SKU).
local have = tonumber(redis.call('GET', KEYS[1]) or '-1')
local q = tonumber(ARGV[1])
if have < 0 then return {-1, -1} end
if have < q then return {-1, have} end
return {redis.call('DECRBY', KEYS[1], q), redis.call('INCR', KEYS[2])}
