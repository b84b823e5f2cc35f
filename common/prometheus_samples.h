// Building prometheus-cpp's MetricFamily by hand, for collectables that
// compute their figures at each scrape (rendezvous/server/metrics.h,
// agent/metrics.h). Header-only: its users link prometheus-cpp's core.
#ifndef MUSTER_COMMON_PROMETHEUS_SAMPLES_H_
#define MUSTER_COMMON_PROMETHEUS_SAMPLES_H_

#include <string>
#include <utility>
#include <vector>

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

namespace muster {

// A family with no samples yet.
inline prometheus::MetricFamily EmptyFamily(std::string name, std::string help,
                                            prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

// Adds a sample of a counter or gauge family.
inline void AddSample(prometheus::MetricFamily& family,
                      std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric& sample = family.metric.emplace_back();
  sample.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
}

}  // namespace muster

#endif  // MUSTER_COMMON_PROMETHEUS_SAMPLES_H_
