#include "ref/linear.h"

#include "futransformer/error.h"
#include "ref/ops.h"

namespace futransformer::ref {

RefLinear::RefLinear(std::string name, int64_t out_features, int64_t in_features,
                     std::shared_ptr<const std::vector<float>> weight)
    : name_(std::move(name)), out_(out_features), in_(in_features), weight_(std::move(weight)) {
  check(out_ > 0 && in_ > 0, "linear '", name_, "': sizes [", out_, ", ", in_, "] must be positive");
  check(weight_ != nullptr && static_cast<int64_t>(weight_->size()) / in_ == out_ &&
            static_cast<int64_t>(weight_->size()) % in_ == 0,
        "linear '", name_, "': ", weight_ ? weight_->size() : 0, " weights given for shape [", out_, ", ", in_, "]");
}

RefLinear RefLinear::from_tensor(const Tensor& t) {
  check(t.shape.size() == 2, "tensor '", t.name, "' has shape ", t.shape_str(), ", expected 2 dims [out, in]");
  return RefLinear(t.name, t.shape[0], t.shape[1], std::make_shared<const std::vector<float>>(t.to_f32()));
}

void RefLinear::forward(const float* x, int64_t rows, float* y) const {
  check(weight_ != nullptr, "linear '", name_, "' has no weights");
  if (!quantizer_) {
    matmul_nt(x, weight_->data(), y, rows, out_, in_);
    return;
  }
  std::vector<float> xq(x, x + rows * in_);
  quantizer_(xq.data(), rows, in_);
  matmul_nt(xq.data(), weight_->data(), y, rows, out_, in_);
}

}  // namespace futransformer::ref
