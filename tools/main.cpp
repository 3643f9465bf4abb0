// weightlift: command-line entry point. Exit codes: 0 ok, 1 error, 2 usage.
#include <cstdio>
#include <map>
#include <new>

#include "command.h"
#include "weightlift/hub.h"
#include "weightlift/weight_files.h"

namespace wl::cli {

std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

int fail(const Status& s) {
  std::fprintf(stderr, "weightlift: error: %s\n", s.to_string().c_str());
  return 1;
}

Result<std::vector<std::string>> weight_files_of(const std::vector<std::string>& paths, const std::string& revision,
                                                 bool offline, std::vector<std::unique_ptr<HubSource>>* sources) {
  std::vector<std::string> files;
  for (const auto& path : paths) {
    HubOptions hub;
    if (offline) hub.offline = true;
    hub.log = [](const std::string& line) {  // warnings only: a file no source vouches for, say
      if (line.starts_with("warning: ")) std::fprintf(stderr, "weightlift: %s\n", inert(line).c_str());
    };
    // A URL (s3://, gs://, http(s)://) is never a Hub repository: its own source reports what is wrong.
    if (sources && !is_url(path) && !Env::Default()->exists(path)) {
      WL_ASSIGN_OR_RETURN(auto source, HubSource::start(path, revision, hub));
      files.insert(files.end(), source->weight_files().begin(), source->weight_files().end());
      sources->push_back(std::move(source));
      continue;
    }
    WL_ASSIGN_OR_RETURN(std::string local, resolve_model_path(path, revision, hub));
    WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(local));
    files.insert(files.end(), wf.files.begin(), wf.files.end());
  }
  return files;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "weightlift: error: %s\n", inert(message).c_str());
  return 2;
}

std::string json_line(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace wl::cli

int main(int argc, char** argv) {
  using namespace wl::cli;
  CLI::App app{"weightlift: load model weights from anywhere into memory, fast and safely"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "weightlift 0.1.0");
  std::map<CLI::App*, RunFn> runs;
  auto cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "weightlift: error: %s\nRun with --help for usage.\n", wl::inert(e.what()).c_str());
    return 2;
  }
  for (auto& [sub, run] : runs) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::bad_alloc&) {  // a last resort: admission should have refused the allocation first
        std::fprintf(stderr, "weightlift: error: out of memory (an allocation failed: std::bad_alloc)\n");
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "weightlift: error: internal: %s\n", wl::inert(e.what()).c_str());
        return 1;
      }
    }
  }
  return 2;
}
