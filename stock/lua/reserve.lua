-- reserve.lua: the `lua` strategy's whole order step, in one atomic script:
-- validity of the stock copy, idempotency, per-user limit, stock check,
-- decrement (across segments if need be) and the pending record.
--
-- KEYS[1] gen       "<generation>:<run_id>" of the stock copy
-- KEYS[2] pending   hash order_id -> JSON record of the reserved order
-- KEYS[3] users     hash user_id -> units bought
-- KEYS[4] idem      idempotency record of this request's key
-- KEYS[5] empty     bitmap: bit i set => segment i holds 0 units
-- KEYS[6..]         stock segments 0 .. n-1
-- ARGV[1] run_id of the Redis the caller is connected to
-- ARGV[2] order_id   ARGV[3] user_id   ARGV[4] quantity   ARGV[5] per-user limit
-- ARGV[6] fingerprint of the request ("" when no idempotency key)
-- ARGV[7] first segment to try (0-based)   ARGV[8] instance id
-- ARGV[9] idempotency record TTL in ms     ARGV[10] the idempotency key
--
-- Returns {1, gen, spec}        reserved; spec = "seg:units,..."
--         {2, order_id, fp}     replay of an earlier request with this key
--         {0, 0}                sold out
--         {-1, available}       fewer units left than asked
--         {-2, bought}          per-user limit would be passed
--         {-3}                  no valid copy: the caller rebuilds it
local g = redis.call('GET', KEYS[1])
if not g then return {-3} end
local gen, run_id = string.match(g, '^(%d+):(.*)$')
if run_id ~= ARGV[1] then return {-3} end

if ARGV[6] ~= '' then
    local rec = redis.call('GET', KEYS[4])
    if rec then
        local rgen, oid, fp = string.match(rec, '^(%d+)|([^|]*)|(.*)$')
        if rgen == gen then return {2, oid, fp} end
    end
end

local qty = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
if limit > 0 then
    local bought = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0')
    if bought + qty > limit then return {-2, bought} end
end

-- Walk the segments from the chosen one, planning what to take from each;
-- nothing is written until the whole quantity is found. Segments the bitmap
-- marks empty are skipped without a read (bit set => exactly 0 units).
local n = #KEYS - 5
local first = tonumber(ARGV[7])
local need, seen = qty, 0
local plan = {}
local bm = (n > 1) and redis.call('GET', KEYS[5]) or false
for i = 0, n - 1 do
    local seg = (first + i) % n
    local v = 0
    local b = bm and string.byte(bm, math.floor(seg / 8) + 1)
    if not (b and bit.band(b, bit.rshift(128, seg % 8)) ~= 0) then
        v = tonumber(redis.call('GET', KEYS[6 + seg]))
        if not v then return {-3} end
    end
    if v > 0 then
        local t = math.min(v, need)
        plan[#plan + 1] = seg
        plan[#plan + 1] = t
        need = need - t
        seen = seen + v
        if need == 0 then break end
    end
end
if need > 0 then
    if seen == 0 then return {0, 0} end
    return {-1, seen}
end

local spec = {}
for i = 1, #plan, 2 do
    local left = redis.call('DECRBY', KEYS[6 + plan[i]], plan[i + 1])
    if left == 0 and n > 1 then redis.call('SETBIT', KEYS[5], plan[i], 1) end
    spec[#spec + 1] = plan[i] .. ':' .. plan[i + 1]
end
spec = table.concat(spec, ',')
if limit > 0 then redis.call('HINCRBY', KEYS[3], ARGV[3], qty) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The pending record, format 2 (docs/storage.md): "2|q|t|l|spec|" then the
-- instance, the user and the key, each as <length>:<bytes>. (Cheaper for
-- Redis to build than JSON; readers also accept the JSON of format 1.)
redis.call('HSET', KEYS[2], ARGV[2], '2|' .. qty .. '|' .. now .. '|' ..
    ((limit > 0) and 1 or 0) .. '|' .. spec .. '|' .. #ARGV[8] .. ':' .. ARGV[8] ..
    #ARGV[3] .. ':' .. ARGV[3] .. #ARGV[10] .. ':' .. ARGV[10])
if ARGV[6] ~= '' then
    redis.call('SET', KEYS[4], gen .. '|' .. ARGV[2] .. '|' .. ARGV[6], 'PX', ARGV[9])
end
return {1, tonumber(gen), spec}
