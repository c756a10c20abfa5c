"""On-disk dataset formats: NVIDIA's FeatureSpec and split-binary (TFRecords and NCF layouts join here)."""
