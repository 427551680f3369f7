-- Nexmark q21, add channel id: each bid of a known channel, or whose URL
-- carries a channel_id, with that channel's id.
-- Published (Flink):
--   SELECT auction, bidder, price, channel,
--          CASE WHEN lower(channel) = 'apple' THEN '0'
--               WHEN lower(channel) = 'google' THEN '1'
--               WHEN lower(channel) = 'facebook' THEN '2'
--               WHEN lower(channel) = 'baidu' THEN '3'
--               ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
--   FROM bid
--   WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null
--      OR lower(channel) in ('apple', 'google', 'facebook', 'baidu')
-- ubik: REGEXP_EXTRACT(s, p, 2) (the second group of the first match, null
-- without one) is written with built-ins: regexp_like for "is there a
-- match", regexp_replace of the whole string by the group for its value.
-- oracle: the query, in one shot
SELECT
    auction, bidder, price, channel,
    CASE
        WHEN lower(channel) = 'apple' THEN '0'
        WHEN lower(channel) = 'google' THEN '1'
        WHEN lower(channel) = 'facebook' THEN '2'
        WHEN lower(channel) = 'baidu' THEN '3'
        WHEN regexp_like(url, '(&|^)channel_id=')
            THEN regexp_replace(url, '^.*?(&|^)channel_id=([^&]*).*$', '${2}')
    END AS channel_id
FROM bid
WHERE regexp_like(url, '(&|^)channel_id=')
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
