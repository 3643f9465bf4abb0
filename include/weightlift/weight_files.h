// weightlift/weight_files.h: choosing which files of a model folder hold its
// weights, as the reference (vLLM's weight utilities) does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "weightlift/format.h"
#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";

// Natural order of base names: "model-2-of-10" before "model-10-of-10".
bool natural_less(std::string_view a, std::string_view b);
void natural_sort(std::vector<std::string>& paths);  // by base name
// The runs natural_less compares: `name` split into non-digit and digit runs,
// always starting and ending with a (possibly empty) non-digit run, as
// Python's re.split(r"(\d+)", name) gives ("10.st" -> "", "10", ".st").
std::vector<std::string> natural_key(std::string_view name);

// Keeps only the files that the index's weight_map names (a consolidated file
// beside shards is dropped). No index in `folder`: the list is unchanged.
// An index entry whose file is missing is kNotFound naming it; a malformed
// index, or one that repeats a key at any level (a tensor mapped twice), is
// kCorruptData.
Result<std::vector<std::string>> filter_duplicate_safetensors_files(const std::vector<std::string>& files,
                                                                    const std::string& folder,
                                                                    std::string_view index_name = kSafetensorsIndexName,
                                                                    Env* env = Env::Default());

// Drops training-only files: training_args.bin, optimizer.bin, optimizer.pt,
// scheduler.pt, scaler.pt.
std::vector<std::string> filter_files_not_needed_for_inference(const std::vector<std::string>& files);

struct WeightFiles {
  std::vector<std::string> files;  // full paths, natural order
  WeightFormat format = WeightFormat::kSafetensors;
};

// The weights of PATH. A file is itself, its format the one the format
// registry (checkpoint.h) gives its extension (safetensors when none does). A
// folder, as the reference chooses: "*.safetensors", else "*.bin", else "*.pt"
// (the first pattern that matches anything), de-duplicated with the index,
// training files dropped, naturally sorted. No weights found is kNotFound.
Result<WeightFiles> find_weight_files(const std::string& path, Env* env = Env::Default());

// The weight files a user means by PATH: a file is itself; a folder gives the
// files its model.safetensors.index.json names, else its *.safetensors in natural order.
Result<std::vector<std::string>> resolve_weight_files(const std::string& path, Env* env = Env::Default());

}  // namespace wl
