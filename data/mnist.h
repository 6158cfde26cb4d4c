// The MNIST layout of a folder (also Fashion-MNIST's and KMNIST's): {train,t10k}-images-idx3-ubyte
// and {train,t10k}-labels-idx1-ubyte, each gzip-compressed (.gz) or not, read into tensors, as
// libtorch's torch::data::datasets::MNIST does.
#pragma once

#include <cstdint>
#include <string>

#include "framework/tensor.h"

namespace ampgrad::data {

/// Which half of the data set: the train-* files or the t10k-* files.
enum class MnistSplit : uint8_t { kTrain, kTest };
/// Which file of a split: the images (idx3) or the labels (idx1).
enum class MnistFile : uint8_t { kImages, kLabels };

/// How much of a split load_mnist reads, and the labels it accepts.
struct MnistOptions {
  int64_t max_samples = -1;  ///< read only the first ones (< 0: all)
  int64_t num_classes = 10;  ///< every label must be in [0, num_classes)
};

/// A split as tensors, sample i being images[i] and labels[i].
struct MnistData {
  Tensor images;  ///< float32 [N, rows, cols]: pixel / 255, in [0, 1]
  Tensor labels;  ///< int64 [N]
};

/// The path load_mnist reads for a split's images or labels: DIR/NAME.gz if it exists, else DIR/NAME
/// (NAME is e.g. train-images-idx3-ubyte).
std::string mnist_path(const std::string& dir, MnistSplit split, MnistFile file);

/// Reads a split of the data set in `dir`. Throws an Error naming the file for anything read_idx
/// refuses, for images that are not [N, rows, cols] or labels that are not [N], for image and
/// label files that disagree on N, and for a label outside [0, num_classes).
MnistData load_mnist(const std::string& dir, MnistSplit split, const MnistOptions& options = {});

}  // namespace ampgrad::data
