// Prometheus metrics of the inference service (spec/serving.md §3.5), registered once in a
// registry that the exposer serves. Thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dsflash::engine {

class Metrics {
 public:
  explicit Metrics(const std::string& model_name);
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void request_done(const std::string& rpc, const std::string& code);
  void finished(const std::string& reason);
  void rejected(const std::string& reason);

  prometheus::Gauge* running;
  prometheus::Gauge* waiting;
  prometheus::Gauge* queue_capacity;
  prometheus::Gauge* model_loaded;
  prometheus::Gauge* load_progress;
  prometheus::Histogram* ttft;
  prometheus::Histogram* inter_token;
  prometheus::Histogram* e2e;
  prometheus::Histogram* queue_time;
  prometheus::Histogram* prefill_time;
  prometheus::Histogram* decode_time;
  prometheus::Histogram* prompt_tokens_hist;
  prometheus::Histogram* generation_tokens_hist;
  prometheus::Counter* prompt_tokens;
  prometheus::Counter* generation_tokens;
  prometheus::Gauge* store_up;  // 1 while the expert store session is up (or experts are in-process)
  prometheus::Histogram* expert_fetch(bool hit) { return hit ? expert_hit_ : expert_miss_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* finished_;
  prometheus::Family<prometheus::Counter>* rejections_;
  prometheus::Histogram *expert_hit_, *expert_miss_;
};

}  // namespace dsflash::engine
