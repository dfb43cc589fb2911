-- forget.lua: forgets return.lua's markers of orders decided before a
-- watermark W, so that a long sale's ended holds do not stay in Redis.
--
-- The caller (stock_returned_forget) chose W so that every order decided
-- before it was given back and its debt cleared (no return of it is owed
-- any more), with a margin for decisions stamped by a clock behind W and
-- committed later. A repeat of one of those returns (a retry still in
-- flight, a second instance) must still add nothing once its marker is
-- gone: return.lua answers -6 for any order decided before W. So W is
-- raised first and the buckets deleted after, in this one script: no
-- return can run between the two and find neither marker nor watermark.
-- W only rises (a caller with an older view of the debts, or a slower
-- clock, never lowers it).
--
-- KEYS[1] returned:before (the watermark)   KEYS[2..] returned:<bucket> to
-- delete (the caller passes only buckets wholly before the new W)
-- ARGV[1] W (ms)   ARGV[2] STOCK_RETURNED_BUCKET_MS
-- Returns how many of the buckets it deleted existed.
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local w = tonumber(ARGV[1])
if w > old then
    redis.call('SET', KEYS[1], ARGV[1])
else
    w = old
end
-- A bucket goes only when its whole span ends at or before the watermark
-- in force: checked here too, so that a caller's slip cannot drop a marker
-- that return.lua would still look for.
local span, gone = tonumber(ARGV[2]), 0
for i = 2, #KEYS do
    local b = tonumber(string.match(KEYS[i], ':(%d+)$'))
    if b and (b + 1) * span <= w then gone = gone + redis.call('UNLINK', KEYS[i]) end
end
return gone
