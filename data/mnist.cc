// load_mnist (see mnist.h).
#include "data/mnist.h"

#include <filesystem>

#include "data/idx.h"
#include "framework/error.h"

namespace ampgrad::data {

std::string mnist_path(const std::string& dir, MnistSplit split, MnistFile file) {
  const std::string name = std::string(split == MnistSplit::kTrain ? "train" : "t10k") +
                           (file == MnistFile::kImages ? "-images-idx3-ubyte" : "-labels-idx1-ubyte");
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  std::error_code ec;
  if (std::filesystem::exists(base, ec) && !std::filesystem::exists(base.string() + ".gz", ec)) return base.string();
  return base.string() + ".gz";  // also the name a missing file is reported under
}

MnistData load_mnist(const std::string& dir, MnistSplit split, const MnistOptions& options) {
  AG_CHECK(options.num_classes >= 1, "load_mnist: num_classes must be >= 1, got ", options.num_classes);
  const std::string images_path = mnist_path(dir, split, MnistFile::kImages);
  const std::string labels_path = mnist_path(dir, split, MnistFile::kLabels);
  const IdxArray images = read_idx(images_path, options.max_samples);
  AG_CHECK(images.shape.size() == 3, "load_mnist: ", images_path, " holds an array of shape ",
           shape_to_string(images.shape), "; images must be [count, rows, columns]");
  const IdxArray labels = read_idx(labels_path, options.max_samples);
  AG_CHECK(labels.shape.size() == 1, "load_mnist: ", labels_path, " holds an array of shape ",
           shape_to_string(labels.shape), "; labels must be [count]");
  AG_CHECK(images.declared_items == labels.declared_items, "load_mnist: ", images_path, " holds ",
           images.declared_items, " images but ", labels_path, " holds ", labels.declared_items,
           " labels; hint: the two files come from different data sets or splits");

  MnistData out;
  out.images = Tensor::empty(images.shape);
  float* pixels = out.images.data<float>();
  for (size_t i = 0; i < images.values.size(); ++i) pixels[i] = static_cast<float>(images.values[i]) / 255.0f;
  std::vector<int64_t> classes(labels.values.begin(), labels.values.end());
  for (size_t i = 0; i < classes.size(); ++i) {
    AG_CHECK(classes[i] < options.num_classes, "load_mnist: ", labels_path, ": label ", i, " is ", classes[i],
             ", outside [0, ", options.num_classes, ")");
  }
  out.labels = Tensor::from_vector(classes, {static_cast<int64_t>(classes.size())});
  return out;
}

}  // namespace ampgrad::data
