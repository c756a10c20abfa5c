"""DLRM in TensorFlow 2 / Keras 3 on the split-binary + FeatureSpec data models.dlrm trains on (NVIDIA's
TensorFlow2/Recommendation/DLRM_and_DCNv2 recipe), data parallel under tf.distribute (models.tfkit)."""
