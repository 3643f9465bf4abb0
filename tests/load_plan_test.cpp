// plan_load() / execute() (load_plan.h): a load decided once, as a value.
// The plan holds every decision (the runners read only it), a dry run reads
// no tensor bytes, a plan can be carried out more than once, files a source
// is still writing are a fact the engine asks for, and the CLI's --verbose
// prints the plan the engine made.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine_test_util.h"
#include "test_util.h"
#include "weightlift/load_plan.h"
#include "weightlift/synth.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::TempDir;

std::vector<std::string> two_files(TempDir& dir) {
  testing::write_st(dir.file("a.safetensors"),
                    {{"a.w", testing::make_f32({64, 64}, 1)}, {"a.v", testing::make_f32({3}, 2)}});
  testing::write_st(dir.file("b.safetensors"), {{"b.w", testing::make_f32({128, 16}, 3)}});
  return {dir.file("a.safetensors"), dir.file("b.safetensors")};
}

std::map<std::string, std::string> run(const LoadPlan& plan, LoadStats* stats = nullptr) {
  std::map<std::string, std::string> out;
  auto r = execute(plan, [&](LoadedTensor&& t) {
    out[t.name] = std::string(reinterpret_cast<const char*>(t.view.data()), t.view.nbytes());
    return Status();
  });
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok() && stats) *stats = *r;
  return out;
}

TEST(LoadPlan, PlanThenExecuteIsLoadFiles) {
  TempDir dir;
  auto files = two_files(dir);
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch, Strategy::kThreads, Strategy::kStream}) {
    SCOPED_TRACE(std::string(strategy_name(s)));
    LoadOptions o;
    o.strategy = s;
    auto want = testing::load_all(files, o);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    auto plan = plan_load(files, o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->file_count(), 2u);
    EXPECT_EQ(plan->tensor_count(), 3u);
    EXPECT_EQ(plan->bytes(), (64u * 64 + 3 + 128 * 16) * 4);
    EXPECT_EQ(plan->path().strategy, s);
    LoadStats st;
    EXPECT_EQ(run(*plan, &st), *want);
    EXPECT_EQ(st.strategy, s);
    EXPECT_EQ(st.tensors, 3u);
    // A plan is a value: carried out again, it reads the same bytes (its readers reopened).
    EXPECT_EQ(run(*plan), *want);
  }
}

TEST(LoadPlan, ThePlanHoldsEveryDecision) {
  TempDir dir;
  auto files = two_files(dir);
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.threads = 3;
  o.block_size = 8 << 10;  // 24 KiB of tensors: 4 reads, 3 threads
  o.direct = Toggle::kOff;
  o.max_memory = 1 << 20;
  std::vector<std::string> logged;
  o.log = [&](const std::string& l) { logged.push_back(l); };
  auto plan = plan_load(files, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const StreamSetup& s = plan->path().stream;
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.read_size, uint64_t{8} << 10);
  EXPECT_EQ(s.window, uint64_t{1} << 20);  // buffered: the whole cap is the window
  EXPECT_FALSE(s.direct);
  // What plan_load logged is the plan's log, the readers' setup last; executing logs none of it again.
  EXPECT_EQ(logged, plan->log());
  ASSERT_FALSE(logged.empty());
  EXPECT_EQ(logged.back(), "stream: 3 threads, 8 KiB reads, buffered, to cpu, memory cap 1 MiB");
  const std::string text = plan->describe();
  EXPECT_EQ(text.rfind("plan: 2 files, 3 tensors, ", 0), 0u) << text;
  EXPECT_NE(text.find("\nread: stream (buffered)"), std::string::npos) << text;
  EXPECT_NE(text.find(logged.back()), std::string::npos) << text;
  logged.clear();
  run(*plan);
  EXPECT_TRUE(logged.empty()) << ::testing::PrintToString(logged);
  // More threads than the stream has reads: the plan fits them to the bytes.
  o.threads = 64;
  o.block_size = 1 << 20;
  auto fitted = plan_load(files, o);
  ASSERT_TRUE(fitted.ok());
  EXPECT_EQ(fitted->path().stream.threads, 1);  // 24 KiB of tensors: one read
}

TEST(LoadPlan, ADryRunReadsNoTensorBytes) {
  TempDir dir;
  auto files = two_files(dir);
  testing::CountingEnv env;
  LoadOptions o;
  o.env = &env;
  o.strategy = Strategy::kStream;
  o.direct = Toggle::kOff;
  auto plan = plan_load(files, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  uint64_t read = 0;
  for (const auto& r : env.reads()) read += r.len;
  EXPECT_LT(read, plan->bytes() / 4) << "planning reads headers only";
  // Facts the caller holds win over what the engine would find out.
  LoadOptions nfs;
  nfs.known.fs_type = "nfs";
  nfs.known.checkpoint_bytes = 10;
  nfs.known.available_bytes = 1000;
  auto pre = plan_load(files, nfs);
  ASSERT_TRUE(pre.ok());
  EXPECT_EQ(pre->path().strategy, Strategy::kPrefetch);
  ASSERT_TRUE(pre->path().prefetch.has_value());
  EXPECT_EQ(pre->path().prefetch->fstype, "nfs");
  EXPECT_EQ(pre->path().prefetch_threads, kDefaultPrefetchThreads);
}

// A source still writing the files (the Hub's load while downloading): the
// engine asks the Env, and reads them as views of the bytes that arrived.
class ArrivingEnv final : public EnvWrapper {
 public:
  ArrivingEnv() : EnvWrapper(Env::Default()) {}
  bool arriving(const std::string&) override { return true; }
};

TEST(LoadPlan, FilesStillArrivingAreAFactTheEngineAsks) {
  TempDir dir;
  auto files = two_files(dir);
  ArrivingEnv env;
  LoadOptions o;
  o.env = &env;
  auto plan = plan_load(files, o);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->path().strategy, Strategy::kLazy);
  EXPECT_TRUE(plan->path().file_views);
  ASSERT_FALSE(plan->log().empty());
  EXPECT_NE(plan->log()[0].find("files still arriving"), std::string::npos) << plan->log()[0];
  auto want = testing::load_all(files, {});
  EXPECT_EQ(run(*plan), *want);
}

TEST(LoadPlan, BadOptionsAreRefusedWhenPlanning) {
  LoadOptions o;
  o.threads = -1;
  EXPECT_EQ(plan_load({}, o).status().code(), Code::kInvalidArgument);
  o.threads = 0;
  o.env = nullptr;
  EXPECT_EQ(plan_load({}, o).status().code(), Code::kInvalidArgument);
  LoadOptions missing;
  auto r = plan_load({"/nonexistent/x.safetensors"}, missing);
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().file(), "/nonexistent/x.safetensors");
}

// `weightlift load --verbose` prints the plan the engine made: the same
// lines an in-process plan of the same files and options gives.
TEST(LoadPlan, CliVerbosePrintsThePlanTheEngineMade) {
  TempDir dir;
  SynthOptions so;
  so.target_bytes = uint64_t{1} << 20;
  ASSERT_TRUE(synth_model(dir.path(), so).ok());
  auto files = find_weight_files(dir.path());
  ASSERT_TRUE(files.ok());
  struct Case {
    std::vector<std::string> flags;
    LoadOptions o;
  };
  std::vector<Case> cases(3);
  cases[0].flags = {"--strategy", "stream", "--threads", "3", "--block-size", "64KiB", "--direct", "off"};
  cases[0].o.strategy = Strategy::kStream, cases[0].o.threads = 3, cases[0].o.block_size = 64 << 10;
  cases[0].o.direct = Toggle::kOff;
  cases[1].flags = {"--strategy", "stream", "--direct", "on", "--max-memory", "2MiB"};
  cases[1].o.strategy = Strategy::kStream, cases[1].o.direct = Toggle::kOn, cases[1].o.max_memory = 2 << 20;
  cases[2].flags = {"--strategy", "threads", "--threads", "2"};
  cases[2].o.strategy = Strategy::kThreads, cases[2].o.threads = 2;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.flags));
    std::vector<std::string> args = {"load", dir.path(), "--verbose", "--no-progress"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    auto r = testing::run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto plan = plan_load(files->files, c.o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_FALSE(plan->log().empty());
    std::string expect;
    for (const std::string& line : plan->log()) expect += line + "\n";
    EXPECT_EQ(r.err.rfind(expect, 0), 0u) << "stderr:\n" << r.err << "\nthe plan's log:\n" << expect;
    // The summary names what ran, as the plan said.
    const std::string ran = std::string("strategy ") + std::string(strategy_name(plan->path().strategy));
    EXPECT_NE(r.err.find(ran), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace wl
