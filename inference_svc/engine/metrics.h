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
  // backend: "cpu" or "cuda", a label of llm_build_info.
  Metrics(const std::string& model_name, const std::string& backend);
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
  // Prefix reuse (engine.h, EngineOptions::prefix_cache): prompt tokens whose prefill a kept
  // sequence spared, requests by whether one continued a kept sequence, and the tokens kept.
  prometheus::Counter* prompt_tokens_cached;
  prometheus::Counter* prefix_lookup(bool hit) { return hit ? prefix_hit_ : prefix_miss_; }
  prometheus::Gauge* prefix_cache_tokens;
  prometheus::Gauge *host_mem_total, *host_mem_available;  // /proc/meminfo, refreshed by the server
  prometheus::Gauge* store_up;  // 1 while the expert store session is up (or experts are in-process)
  prometheus::Histogram* expert_fetch(bool hit) { return hit ? expert_hit_ : expert_miss_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* finished_;
  prometheus::Family<prometheus::Counter>* rejections_;
  prometheus::Histogram *expert_hit_, *expert_miss_;
  prometheus::Counter *prefix_hit_, *prefix_miss_;
};

}  // namespace dsflash::engine
