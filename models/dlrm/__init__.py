"""DLRM (PyTorch) as NVIDIA DeepLearningExamples builds it, trained by torchrun on split-binary datasets."""
