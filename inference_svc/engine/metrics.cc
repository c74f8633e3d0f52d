#include "inference_svc/engine/metrics.h"

namespace dsflash::engine {
namespace {

prometheus::Histogram::BucketBoundaries exp_buckets(double first, double factor, int n) {
  prometheus::Histogram::BucketBoundaries b;
  double v = first;
  for (int i = 0; i < n; ++i, v *= factor) b.push_back(v);
  return b;
}

prometheus::Histogram* hist(prometheus::Registry& r, const std::string& name, const std::string& help,
                            prometheus::Histogram::BucketBoundaries b) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(b));
}

prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name, const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

Metrics::Metrics(const std::string& model_name, const std::string& backend) : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  requests_ = &prometheus::BuildCounter().Name("llm_requests_total").Help("RPCs by method and gRPC status").Register(r);
  finished_ = &prometheus::BuildCounter().Name("llm_request_finished_total").Help("Generations by finish reason").Register(r);
  rejections_ = &prometheus::BuildCounter().Name("llm_admission_rejections_total").Help("Requests refused at admission").Register(r);
  // Series that alerts and dashboards rate() exist from start-up, at 0.
  for (const char* reason : {"queue_full", "draining", "memory"}) rejections_->Add({{"reason", reason}});
  for (const char* reason : {"length", "eos", "stop_sequence", "stop_token"}) finished_->Add({{"reason", reason}});
  running = gauge(r, "llm_num_requests_running", "Requests being generated");
  waiting = gauge(r, "llm_num_requests_waiting", "Requests in the admission queue");
  queue_capacity = gauge(r, "llm_admission_queue_capacity", "Bound of the admission queue");
  model_loaded = gauge(r, "llm_model_loaded", "1 once the model is loaded and the service ready");
  load_progress = gauge(r, "llm_model_load_progress_ratio", "Fraction of the resident weights read at start-up");
  ttft = hist(r, "llm_time_to_first_token_seconds", "Time to first token", exp_buckets(0.005, 2, 17));
  inter_token = hist(r, "llm_inter_token_latency_seconds", "Time between streamed tokens", exp_buckets(0.001, 2, 12));
  e2e = hist(r, "llm_e2e_request_latency_seconds", "Request latency end to end", exp_buckets(0.01, 2, 16));
  queue_time = hist(r, "llm_request_queue_time_seconds", "Time waiting for admission", exp_buckets(0.001, 2, 18));
  prefill_time = hist(r, "llm_request_prefill_time_seconds", "Prefill time", exp_buckets(0.001, 2, 18));
  decode_time = hist(r, "llm_request_decode_time_seconds", "Decode time", exp_buckets(0.01, 2, 16));
  prompt_tokens_hist = hist(r, "llm_request_prompt_tokens", "Prompt tokens per request", exp_buckets(1, 2, 20));
  generation_tokens_hist = hist(r, "llm_request_generation_tokens", "Generated tokens per request", exp_buckets(1, 2, 16));
  prompt_tokens = &prometheus::BuildCounter()
                       .Name("llm_prompt_tokens_total")
                       .Help("Prompt tokens of the requests run (llm_prompt_tokens_cached_total of them not prefilled again)")
                       .Register(r)
                       .Add({});
  prompt_tokens_cached = &prometheus::BuildCounter()
                              .Name("llm_prompt_tokens_cached_total")
                              .Help("Prompt tokens whose prefill a kept sequence spared (prefix reuse)")
                              .Register(r)
                              .Add({});
  auto& lookups = prometheus::BuildCounter()
                      .Name("llm_prefix_cache_requests_total")
                      .Help("Requests by whether they continued a kept sequence (hit) or were prefilled whole (miss)")
                      .Register(r);
  prefix_hit_ = &lookups.Add({{"result", "hit"}});
  prefix_miss_ = &lookups.Add({{"result", "miss"}});
  prefix_cache_tokens = gauge(r, "llm_prefix_cache_tokens", "Tokens held by the sequences kept for prefix reuse");
  generation_tokens =
      &prometheus::BuildCounter().Name("llm_generation_tokens_total").Help("Tokens generated").Register(r).Add({});
  host_mem_total = gauge(r, "llm_host_mem_total_bytes", "MemTotal of /proc/meminfo (on GB10 shared by CPU and GPU)");
  host_mem_available = gauge(r, "llm_host_mem_available_bytes", "MemAvailable of /proc/meminfo (on GB10 shared by CPU and GPU)");
  store_up = gauge(r, "llm_expert_store_up", "1 while routed experts are reachable (store session up, or in-process)");
  store_up->Set(1);
  auto& fetch = prometheus::BuildHistogram()
                    .Name("llm_expert_fetch_seconds")
                    .Help("Time to acquire one routed expert, by hit (resident) or miss (loaded)")
                    .Register(r);
  expert_hit_ = &fetch.Add({{"result", "hit"}}, exp_buckets(1e-7, 2, 24));
  expert_miss_ = &fetch.Add({{"result", "miss"}}, exp_buckets(1e-5, 2, 22));
  prometheus::BuildGauge()
      .Name("llm_build_info")
      .Help("Build and model information")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"model", model_name}, {"backend", backend}})
      .Set(1);
}

void Metrics::request_done(const std::string& rpc, const std::string& code) {
  requests_->Add({{"rpc", rpc}, {"code", code}}).Increment();
}
void Metrics::finished(const std::string& reason) { finished_->Add({{"reason", reason}}).Increment(); }
void Metrics::rejected(const std::string& reason) { rejections_->Add({{"reason", reason}}).Increment(); }

}  // namespace dsflash::engine
