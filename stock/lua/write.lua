-- write.lua: the write half of the read-check-write strategies. Besides the
-- stock it does everything the `lua` strategy's reserve does (per-user
-- count, pending record, idempotency record) in the same atomic step, so
-- crash recovery works the same for every Redis strategy.
--
-- Fencing: a segment written with a token > 0 goes ahead only if its fence
-- is still where this holder's read left it (format.lua's
-- lock_fence_check: the same epoch, incarnation and token, so no other
-- holder has read since); otherwise the write is refused whole, before
-- anything changes. That is what stops a holder whose lease ran out (a long
-- pause), or whose lock service has since lost its data and started over,
-- from writing over the next holder's work. Runs after format.lua
-- (lock_script_compose).
--
-- KEYS[1] gen   KEYS[2] pending   KEYS[3] users   KEYS[4] idem
-- KEYS[5] empty-segment bitmap
-- KEYS[5+2j-1], KEYS[5+2j]  segment j's stock key and fence key (j = 1..m)
-- ARGV[1] run_id   ARGV[2] generation read   ARGV[3] order_id   ARGV[4] user_id
-- ARGV[5] quantity   ARGV[6] per-user limit   ARGV[7] fingerprint ('' = no key)
-- ARGV[8] instance   ARGV[9] idem TTL ms   ARGV[10] idem key
-- ARGV[11] mode: 'set' (write the value computed from the read) or
--          'decr' (subtract the units taken)
-- then per segment j: ARGV[12+6(j-1)] index, [+1] value to set, [+2] units
-- taken, [+3] fence token (0: not fenced), [+4] its incarnation (16 hex),
-- [+5] the epoch the read was admitted at
-- Returns {1, gen, spec} | {-3} copy gone or rebuilt | {-4} fenced off.
local g = redis.call('GET', KEYS[1])
if not g then return {-3} end
local gen, run_id = string.match(g, '^(%d+):(.*)$')
if run_id ~= ARGV[1] or gen ~= ARGV[2] then return {-3} end

local m = (#KEYS - 5) / 2
for j = 1, m do
    local base = 12 + 6 * (j - 1)
    if tonumber(ARGV[base + 3]) > 0 and
        not lock_fence_check(KEYS[5 + 2 * j], ARGV[base + 4], ARGV[base + 3], ARGV[base + 5]) then
        return {-4}
    end
end

local spec = {}
for j = 1, m do
    local base = 12 + 6 * (j - 1)
    local idx, value, taken, token = ARGV[base], ARGV[base + 1], tonumber(ARGV[base + 2]),
        tonumber(ARGV[base + 3])
    local left
    if ARGV[11] == 'decr' then
        left = redis.call('DECRBY', KEYS[4 + 2 * j], taken)
    else
        redis.call('SET', KEYS[4 + 2 * j], value)
        left = tonumber(value)
    end
    if token > 0 then lock_fence_record(KEYS[5 + 2 * j], ARGV[base + 4], ARGV[base + 3]) end
    redis.call('SETBIT', KEYS[5], tonumber(idx), (left <= 0) and 1 or 0)
    spec[#spec + 1] = idx .. ':' .. taken
end
spec = table.concat(spec, ',')

local qty = tonumber(ARGV[5])
if tonumber(ARGV[6]) > 0 then redis.call('HINCRBY', KEYS[3], ARGV[4], qty) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The pending record, format 2 (docs/storage.md): "2|q|t|l|spec|" then the
-- instance, the user and the key, each as <length>:<bytes>. (Cheaper for
-- Redis to build than JSON; readers also accept the JSON of format 1.)
redis.call('HSET', KEYS[2], ARGV[3], '2|' .. qty .. '|' .. now .. '|' ..
    ((tonumber(ARGV[6]) > 0) and 1 or 0) .. '|' .. spec .. '|' .. #ARGV[8] .. ':' .. ARGV[8] ..
    #ARGV[4] .. ':' .. ARGV[4] .. #ARGV[10] .. ':' .. ARGV[10])
if ARGV[7] ~= '' then
    redis.call('SET', KEYS[4], gen .. '|' .. ARGV[3] .. '|' .. ARGV[7], 'PX', ARGV[9])
end
return {1, tonumber(gen), spec}
