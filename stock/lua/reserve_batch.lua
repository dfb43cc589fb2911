-- reserve_batch.lua: the `lua` strategy's whole order step, for a batch of
-- orders of one SKU in one atomic script: each order in turn is checked and
-- taken -- validity of the stock copy, idempotency, per-user limit, stock,
-- decrement (across segments if need be) and the pending record; and first,
-- the pending records of orders already committed are cleared (so clearing
-- them costs no round trip of its own). The one home of the order step: the
-- loops send a batch (stock/async.c), the blocking side a batch of one
-- (stock/stock.c). All keys are of one SKU, so of one Redis Cluster slot.
--
-- KEYS[1] gen      "<generation>:<run_id>" of the stock copy
-- KEYS[2] pending  hash order_id -> the pending record of a reserved order
-- KEYS[3] users    hash user_id -> units bought
-- KEYS[4] empty    bitmap: bit i set => segment i holds 0 units
-- KEYS[5 .. 4+n]       stock segments 0 .. n-1
-- KEYS[5+n ..]         idempotency records of the orders that have a key
-- ARGV[1] run_id of the Redis the caller is connected to ('*': any)
-- ARGV[2] instance   ARGV[3] idem TTL ms   ARGV[4] per-user limit
-- ARGV[5] segments n   ARGV[6] first segment to try (0-based; order k of the
-- batch starts k after it)   ARGV[7] c: orders to clear
-- ARGV[8 .. 7+c]       their order ids
-- then per order, 6 values: order_id, user_id, quantity, fingerprint ('' when
-- no key), the KEYS index of its idempotency record (0 when none), and the
-- tail of its pending record ("<n>:<user><n>:<key>", built by the caller);
-- its key itself follows only when it has one (7 values then).
--
-- Numbers stay strings where they can: every number Lua turns into a string
-- goes through printf("%.17g"), which was the largest cost of this script.
--
-- Returns one entry per order:
--         {1, gen, spec}        reserved; spec = "seg:units,..."
--         {2, order_id, fp}     replay of an earlier request with this key
--         {0, 0}                sold out
--         {-1, available}       fewer units left than asked
--         {-2, bought}          per-user limit would be passed
--         {-3}                  no valid copy: the caller rebuilds it
local n = tonumber(ARGV[5])
local c = tonumber(ARGV[7])
if c > 0 then redis.call('HDEL', KEYS[2], unpack(ARGV, 8, 7 + c)) end

local g = redis.call('GET', KEYS[1])
local gen, run_id
if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
-- '*' is unsafe-trust-redis: any copy, whoever built it (Redis as the
-- truth, as the distributed lock articles treat it; it sells again what a
-- failover or a lost AOF second undid).
local valid = g and (run_id == ARGV[1] or ARGV[1] == '*')

local limit = tonumber(ARGV[4])
local lflag = (limit > 0) and '|1|' or '|0|'
local inst = #ARGV[2] .. ':' .. ARGV[2]   -- the record's instance field, built once
local segname = {}           -- segment -> its number as a string, made once
local first = tonumber(ARGV[6])
local bm = (valid and n > 1) and redis.call('GET', KEYS[4]) or false
local vals = {}              -- segment -> units, read once per batch
local dirty = {}             -- segments written
local nowstr = nil
local pend = {}              -- HSET field, value pairs
local out = {}

local function units(seg)
    local v = vals[seg]
    if v then return v end
    local b = bm and string.byte(bm, math.floor(seg / 8) + 1)
    if b and bit.band(b, bit.rshift(128, seg % 8)) ~= 0 then
        v = 0                -- marked empty: exactly 0, no read
    else
        v = tonumber(redis.call('GET', KEYS[5 + seg]))
        if not v then return nil end
    end
    vals[seg] = v
    return v
end

local i = 8 + c
local k = 0
while i <= #ARGV do
    local oid, user, qstr, fp, ik, tail = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
        tonumber(ARGV[i + 4]), ARGV[i + 5]
    local qty = tonumber(qstr)
    local key = ''
    i = i + 6
    if ik > 0 then key = ARGV[i]; i = i + 1 end
    k = k + 1
    local res = nil
    if not valid then res = {-3} end
    if not res and ik > 0 then
        local rec = redis.call('GET', KEYS[ik])
        if rec then
            local rgen, roid, rfp = string.match(rec, '^(%d+)|([^|]*)|(.*)$')
            if rgen == gen then res = {2, roid, rfp} end
        end
    end
    local bought = 0
    if not res and limit > 0 then
        bought = tonumber(redis.call('HGET', KEYS[3], user) or '0')
        if bought + qty > limit then res = {-2, bought} end
    end
    if not res then
        local need, seen, plan = qty, 0, {}
        for s = 0, n - 1 do
            local seg = (first + k + s) % n
            local v = units(seg)
            if not v then res = {-3}; break end
            if v > 0 then
                local t = math.min(v, need)
                plan[#plan + 1] = seg
                plan[#plan + 1] = t
                need = need - t
                seen = seen + v
                if need == 0 then break end
            end
        end
        if not res and need > 0 then
            res = (seen == 0) and {0, 0} or {-1, seen}
        end
        if not res then
            local spec = {}
            for j = 1, #plan, 2 do
                local seg, t = plan[j], plan[j + 1]
                vals[seg] = vals[seg] - t
                dirty[seg] = true
                local sn = segname[seg]
                if not sn then sn = tostring(seg); segname[seg] = sn end
                spec[#spec + 1] = sn .. ':' .. ((t == qty) and qstr or tostring(t))
            end
            spec = (#spec == 1) and spec[1] or table.concat(spec, ',')
            if limit > 0 then redis.call('HINCRBY', KEYS[3], user, qstr) end
            if not nowstr then
                local t = redis.call('TIME')    -- "<seconds>", "<microseconds>": milliseconds, as a string
                local us = t[2]
                nowstr = t[1] .. string.sub(string.rep('0', 6 - #us) .. us, 1, 3)
            end
            pend[#pend + 1] = oid
            -- The pending record, format 2 (docs/storage.md): "2|q|t|l|spec|"
            -- then the instance, the user and the key, each as <length>:<bytes>.
            -- (Cheaper for Redis to build than JSON; readers also accept the
            -- JSON of format 1.)
            pend[#pend + 1] = '2|' .. qstr .. '|' .. nowstr .. lflag .. spec .. '|' .. inst .. tail
            if ik > 0 then
                redis.call('SET', KEYS[ik], gen .. '|' .. oid .. '|' .. fp, 'PX', ARGV[3])
            end
            res = {1, tonumber(gen), spec}
        end
    end
    out[k] = res
end

for seg, _ in pairs(dirty) do
    redis.call('SET', KEYS[5 + seg], vals[seg])
    if vals[seg] == 0 and n > 1 then redis.call('SETBIT', KEYS[4], seg, 1) end
end
if #pend > 0 then redis.call('HSET', KEYS[2], unpack(pend)) end
return out
