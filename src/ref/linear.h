// One projection of the reference engine, y = x · Wᵀ, with its weights held as fp32 values. Low-precision weight
// formats (fp8, int4) will be stored here already dequantised, so the engine's math does not change with the format;
// low-precision activations plug in as an input quantiser that rounds each input row before the product.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "futransformer/tensor.h"

namespace futransformer::ref {

class RefLinear {
 public:
  // Rounds `rows` input rows of `cols` values in place (e.g. quantise-dequantise each token to fp8).
  using InputQuantizer = std::function<void(float* x, int64_t rows, int64_t cols)>;

  RefLinear() = default;
  // `weight` is [out_features, in_features]; shared so a tied LM head and the embedding keep one copy.
  RefLinear(std::string name, int64_t out_features, int64_t in_features, std::shared_ptr<const std::vector<float>> weight);
  // A 2-D tensor [out, in] converted to fp32; throws Error naming the tensor if it is not 2-D.
  static RefLinear from_tensor(const Tensor& t);

  void set_input_quantizer(InputQuantizer quantizer) { quantizer_ = std::move(quantizer); }

  // y[rows, out] = q(x)[rows, in] · Wᵀ, where q is the input quantiser (identity when none). x is left unchanged.
  void forward(const float* x, int64_t rows, float* y) const;

  const std::string& name() const { return name_; }
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const std::vector<float>& weight() const { return *weight_; }

 private:
  std::string name_;
  int64_t out_ = 0, in_ = 0;
  std::shared_ptr<const std::vector<float>> weight_;
  InputQuantizer quantizer_;
};

}  // namespace futransformer::ref
