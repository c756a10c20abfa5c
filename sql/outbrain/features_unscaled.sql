-- Every row's features before the train-fitted scaling: CTRs and counts looked up in the train split's counts, the
-- document similarities, the event document's lists, days since published.
--
-- Views read: joined, ctr_counts, similarity, document_lists. Parameters: the CTR thresholds (NVIDIA's:
-- :ad_id_threshold 5, :document_id_promo_threshold 5, :source_id_promo_threshold 10,
-- :publisher_id_promo_threshold 10, :advertiser_id_threshold 10, :campaign_id_threshold 10).
--
-- CTR = clicks / views of the value on the train split, 0 when views < the threshold or the value never appears
-- in train (NVIDIA: JoinGroupby sum/count, `where(count >= threshold, 0)`, FillMissing). Counts: train views of
-- the value, 0 when unseen; log and normalisation come in features.sql.
-- Days since published: event time = timestamp + 1465876799998 ms (Outbrain's epoch), floor of whole days from the
-- document's publish_time; a delta outside [0, 3650] days is null, as is a missing publish_time, and both are
-- filled with the train median in features.sql. [deviation] NVIDIA sets out-of-range deltas to 0 (= "published
-- today") and fills only missing ones with the median; a publish time after the event or decades before it is an
-- error in the data, not a fresh document.
SELECT /*+ BROADCAST(ad, dp, sp, pp, av, ca) */ j.*,
       CAST(coalesce(CASE WHEN ad.views >= :ad_id_threshold THEN ad.clicks / ad.views ELSE 0 END, 0) AS FLOAT)
         AS ad_id_ctr,
       CAST(coalesce(CASE WHEN dp.views >= :document_id_promo_threshold THEN dp.clicks / dp.views ELSE 0 END, 0)
         AS FLOAT) AS document_id_promo_ctr,
       CAST(coalesce(CASE WHEN sp.views >= :source_id_promo_threshold THEN sp.clicks / sp.views ELSE 0 END, 0)
         AS FLOAT) AS source_id_promo_ctr,
       CAST(coalesce(CASE WHEN pp.views >= :publisher_id_promo_threshold THEN pp.clicks / pp.views ELSE 0 END, 0)
         AS FLOAT) AS publisher_id_promo_ctr,
       CAST(coalesce(CASE WHEN av.views >= :advertiser_id_threshold THEN av.clicks / av.views ELSE 0 END, 0)
         AS FLOAT) AS advertiser_id_ctr,
       CAST(coalesce(CASE WHEN ca.views >= :campaign_id_threshold THEN ca.clicks / ca.views ELSE 0 END, 0)
         AS FLOAT) AS campaign_id_ctr,
       coalesce(ad.views, 0) AS ad_id_views,
       coalesce(dp.views, 0) AS document_id_promo_views,
       coalesce(s.sim_categories, 0) AS document_id_document_id_promo_sim_categories,
       coalesce(s.sim_topics, 0) AS document_id_document_id_promo_sim_topics,
       coalesce(s.sim_entities, 0) AS document_id_document_id_promo_sim_entities,
       coalesce(l.topic_id_list, array()) AS topic_id_list,
       coalesce(l.entity_id_list, array()) AS entity_id_list,
       coalesce(l.category_id_list, array()) AS category_id_list,
       d.publish_time_days,
       d.publish_time_promo_days
FROM joined j
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'ad_id') ad ON ad.value = j.ad_id
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'document_id_promo') dp
  ON dp.value = j.document_id_promo
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'source_id_promo') sp
  ON sp.value = j.source_id_promo
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'publisher_id_promo') pp
  ON pp.value = j.publisher_id_promo
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'advertiser_id') av
  ON av.value = j.advertiser_id
LEFT JOIN (SELECT value, clicks, views FROM ctr_counts WHERE feature = 'campaign_id') ca ON ca.value = j.campaign_id
LEFT JOIN similarity s ON s.document_id = j.document_id AND s.document_id_promo = j.document_id_promo
LEFT JOIN document_lists l ON l.document_id = j.document_id
LATERAL VIEW inline(array(struct(
  CASE WHEN floor((j.timestamp + 1465876799998 - CAST(j.publish_time AS BIGINT) * 1000) / 86400000) BETWEEN 0 AND 3650
       THEN floor((j.timestamp + 1465876799998 - CAST(j.publish_time AS BIGINT) * 1000) / 86400000) END AS publish_time_days,
  CASE WHEN floor((j.timestamp + 1465876799998 - CAST(j.publish_time_promo AS BIGINT) * 1000) / 86400000) BETWEEN 0 AND 3650
       THEN floor((j.timestamp + 1465876799998 - CAST(j.publish_time_promo AS BIGINT) * 1000) / 86400000) END
    AS publish_time_promo_days
))) d
