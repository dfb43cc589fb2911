-- wrk_orders.lua: the load of `make bench`: POST /v1/orders for one SKU
-- (WRK_SKU), a fresh buyer per order, through wrk's connections. Prints
-- one line, "STATUS 201=n 409=n ... errors=n", for bench.py to check that
-- every target answered what it was asked (a target refusing fast is no
-- figure). With WRK_GET=1 it GETs the URL instead, a request formatted per
-- call and every status counted all the same: when bench.py compares a GET
-- with a POST, wrk (on the same cores) then does the same work for both.
-- With WRK_BODY it POSTs that body to the URL (its path and query) instead.
local threads, n = {}, 0
local sku = os.getenv("WRK_SKU") or "sku"
local get = os.getenv("WRK_GET") == "1"
local body = os.getenv("WRK_BODY")

function setup(thread)
    thread:set("id", #threads)
    table.insert(threads, thread)
end

function init(args)
    statuses = {}
end

function request()
    n = n + 1
    if get then
        return wrk.format("GET", nil, { ["X-Seq"] = string.format("%d-%d", id, n) })
    end
    if body then
        return wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, body)
    end
    return wrk.format("POST", "/v1/orders", { ["Content-Type"] = "application/json" },
                      string.format('{"sku":"%s","user_id":"b%d-%d","quantity":1}', sku, id, n))
end

function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
    local all = {}
    for _, t in ipairs(threads) do
        for status, count in pairs(t:get("statuses")) do
            all[status] = (all[status] or 0) + count
        end
    end
    local parts = {}
    for status, count in pairs(all) do table.insert(parts, status .. "=" .. count) end
    table.sort(parts)
    local e = summary.errors
    io.write("STATUS " .. table.concat(parts, " ") .. " errors=" ..
             (e.connect + e.read + e.write + e.timeout) .. "\n")
end
