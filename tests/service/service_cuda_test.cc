// dsflash-inference on the CUDA backend as a real process (label gpu; skipped without a GPU):
// tokens drawn on the device (the default) against the same requests drawn on the host
// (--sampling host) by a second process on the same model: greedy, temperature with top-k,
// top-p and min-p, penalties, and min_new_tokens (EOS banned until then). Both draw from the
// same seeded uniforms on the same device logits, so the tokens must agree.
#include "kernels/exec.h"
#include "tests/service/server_process.h"

namespace dsflash::testing {
namespace {

using dsflash::v1::GenerateRequest;

GenerateRequest request(float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
  GenerateRequest req;
  req.set_prompt("Numbers and letters, side by side");
  auto* s = req.mutable_sampling();
  s->set_temperature(temperature);
  if (top_k > 0) s->set_top_k(top_k);
  s->set_top_p(top_p);
  if (min_p > 0.0f) s->set_min_p(min_p);
  s->set_seed(seed);
  req.mutable_stopping()->set_max_new_tokens(24);
  return req;
}

TEST(ServiceCuda, DeviceDrawsMatchHostDraws) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA device";
  ServerProcess dev({"--backend", "cuda"});
  ServerProcess host({"--backend", "cuda", "--sampling", "host"});
  ASSERT_TRUE(dev.ready()) << dev.log();
  ASSERT_TRUE(host.ready()) << host.log();
  grpc::ClientContext ctx;
  dsflash::v1::ModelInfo info;
  ASSERT_TRUE(dev.stub().GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.backend(), "cuda");
  EXPECT_NE(dev.metrics().find("backend=\"cuda\""), std::string::npos);
  std::vector<GenerateRequest> reqs = {request(0.0f, 0, 1.0f, 0.0f, 1), request(1.0f, 0, 1.0f, 0.0f, 2),
                                       request(0.8f, 40, 0.9f, 0.0f, 3), request(1.2f, 0, 0.95f, 0.05f, 4)};
  GenerateRequest pen = request(0.9f, 0, 0.95f, 0.0f, 5);
  pen.mutable_sampling()->set_repetition_penalty(1.3f);
  pen.mutable_sampling()->set_presence_penalty(0.2f);
  pen.mutable_sampling()->set_frequency_penalty(0.1f);
  pen.mutable_stopping()->set_min_new_tokens(16);
  reqs.push_back(pen);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto a = run_stream(dev.stub(), reqs[i]);
    const auto b = run_stream(host.stub(), reqs[i]);
    ASSERT_TRUE(a.status.ok()) << i << ": " << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << i << ": " << b.status.error_message();
    EXPECT_FALSE(a.ids().empty()) << i;
    EXPECT_EQ(a.ids(), b.ids()) << "request " << i;
    EXPECT_EQ(a.text(), b.text()) << "request " << i;
  }
}

}  // namespace
}  // namespace dsflash::testing
