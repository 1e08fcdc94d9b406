// ControlServer (serve_control.h), the control socket of `thindisk serve
// --control`: its answers on in-memory qcow2 images (query-bitmaps, the
// generation a write moves, clear-bitmap with the current and a stale
// generation, every malformed request, several exports, bitmaps it cannot
// track), and the socket itself (ControlCall round trips, mode 0600, a
// path that is a regular file refused, a stale socket replaced).
#include "cli/serve_control.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "qcow2/bitmaps.h"
#include "qcow2/bitmaps_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::json;
using qcow2::testing::Add;
using qcow2::testing::CreateMem;
using qcow2::testing::CreateWrapped;
using qcow2::testing::MemImage;
using qcow2::testing::MustRead;
using qcow2::testing::Options;
using qcow2::testing::Pattern;
using qcow2::testing::Reopen;
using qcow2::testing::Touched;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 16 * kMiB;
constexpr uint64_t kGranule = 64 * 1024;

// A fresh image of `size` bytes with bitmap "daily" (64 KiB, enabled
// unless told otherwise), shared as a control target holds it.
std::shared_ptr<qcow2::Image> NewImage(bool enabled = true, uint64_t size = kSize) {
  MemImage m = CreateMem(Options(size, 64 * 1024));
  if (!m.image) return nullptr;
  Status s = Add(*m.image, "daily", 16, enabled);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::shared_ptr<qcow2::Image>(std::move(m.image));
}

void WriteAt(qcow2::Image& image, uint64_t offset, size_t length) {
  Status s = image.Write(offset, Pattern(offset, length), {});
  ASSERT_TRUE(s.ok()) << s.ToString();
}

Json QueryRequest() { return Json{{"execute", "query-bitmaps"}}; }

Json ClearRequest(const std::string& name,
                  std::optional<uint64_t> generation = std::nullopt) {
  Json args{{"name", name}};
  if (generation) args["generation"] = *generation;
  return Json{{"execute", "clear-bitmap"}, {"arguments", args}};
}

std::string ClassOf(const Json& answer) {
  return answer.contains("error") ? answer["error"].value("class", "?") : "(no error)";
}
std::string DescOf(const Json& answer) {
  return answer.contains("error") ? answer["error"].value("desc", "") : "";
}

bool AllClear(const BitVector& bits) { return bits.NextSet(0) >= bits.size(); }

// `data` sent on a fresh connection to `path`, and the first `lines` lines
// answered (fewer if the server closes first).
std::vector<std::string> RawExchange(const std::string& path, const std::string& data,
                                     size_t lines = 1) {
  std::vector<std::string> answers;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, data.data(), data.size(), MSG_NOSIGNAL) == ssize_t(data.size())) {
    std::string line;
    char c;
    while (answers.size() < lines && ::read(fd, &c, 1) == 1) {
      if (c != '\n') {
        line += c;
      } else {
        answers.push_back(line);
        line.clear();
      }
    }
  }
  ::close(fd);
  return answers;
}

// Memory storage that, once armed, holds the next guest data write (its
// kDataWrite announcement) until released: a write in flight for as long
// as a test wants, as a slow disk makes it.
class GateStorage final : public io::Storage {
 public:
  explicit GateStorage(std::unique_ptr<io::MemoryStorage> m) : m_(std::move(m)) {}
  void Arm() {
    std::lock_guard lock(mu_);
    armed_ = true;
  }
  bool WaitHeld() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  void Announce(io::Event e) override {
    if (e != io::Event::kDataWrite) return;
    std::unique_lock lock(mu_);
    if (!armed_) return;
    armed_ = false;
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override { return m_->ReadAt(o, b); }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    return m_->WriteAt(o, b);
  }
  Status Flush() override { return m_->Flush(); }
  Result<uint64_t> Size() override { return m_->Size(); }
  Status Resize(uint64_t n) override { return m_->Resize(n); }
  Status Allocate(uint64_t o, uint64_t n) override { return m_->Allocate(o, n); }
  Status PunchHole(uint64_t o, uint64_t n) override { return m_->PunchHole(o, n); }
  Status ZeroRange(uint64_t o, uint64_t n) override { return m_->ZeroRange(o, n); }
  Result<uint64_t> NextData(uint64_t o) override { return m_->NextData(o); }
  Result<uint64_t> NextHole(uint64_t o) override { return m_->NextHole(o); }
  Result<uint64_t> AllocatedBytes() override { return m_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return m_->bytes_written(); }
  const std::string& name() const override { return m_->name(); }

 private:
  std::unique_ptr<io::MemoryStorage> m_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;     // guarded by mu_
  bool held_ = false;      // guarded by mu_
  bool released_ = false;  // guarded by mu_
};

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  std::string SocketPath() const { return dir_.File("ctl.sock"); }

  void Start(std::vector<ControlServer::Target> targets) {
    auto started = ControlServer::Start(SocketPath(), std::move(targets));
    ASSERT_TRUE(started.has_value()) << started.status().ToString();
    server_ = std::move(*started);
  }
  void StartOn(std::shared_ptr<qcow2::Image> image) {
    ASSERT_TRUE(image);
    image_ = image;
    Start({{"", image}});
  }

  Json Ask(const Json& request) const { return server_->Answer(request); }

  // The query-bitmaps entry of `name` (null when not listed).
  Json Entry(const std::string& name, const Json& request = QueryRequest()) const {
    Json answer = Ask(request);
    EXPECT_TRUE(answer.contains("return") && answer["return"].is_array())
        << answer.dump();
    if (!answer.contains("return")) return nullptr;
    for (const Json& b : answer["return"]) {
      if (b.value("name", "") == name) return b;
    }
    return nullptr;
  }
  uint64_t Generation(const std::string& name = "daily") const {
    Json e = Entry(name);
    EXPECT_TRUE(e.is_object() && e.contains("generation") &&
                e["generation"].is_number_unsigned())
        << e.dump();
    return e.is_object() ? e.value("generation", uint64_t{0}) : 0;
  }
  uint64_t DirtyBytes(const std::string& name = "daily") const {
    Json e = Entry(name);
    EXPECT_TRUE(e.is_object() && e.contains("dirty-bytes")) << e.dump();
    return e.is_object() ? e.value("dirty-bytes", uint64_t{0}) : 0;
  }

  test_env::TempDir dir_{"/tmp", "td_control"};
  std::shared_ptr<qcow2::Image> image_;
  std::unique_ptr<ControlServer> server_;
};

// ---- query-bitmaps ----

TEST_F(ControlTest, QueryBitmapsListsEveryBitmapWithItsLiveState) {
  auto image = NewImage();
  ASSERT_TRUE(image);
  ASSERT_TRUE(Add(*image, "fine", 12).ok());
  StartOn(image);
  Json answer = Ask(QueryRequest());
  ASSERT_TRUE(answer.contains("return")) << answer.dump();
  ASSERT_EQ(answer["return"].size(), 2u) << answer.dump();
  Json& daily = answer["return"][0];
  EXPECT_EQ(daily["name"], "daily");
  EXPECT_EQ(daily["granularity"], kGranule);
  EXPECT_EQ(daily["enabled"], true);
  EXPECT_EQ(daily["consistent"], true);
  EXPECT_EQ(daily["tracked"], true);
  EXPECT_TRUE(daily["generation"].is_number_unsigned()) << daily.dump();
  EXPECT_EQ(daily["dirty-bytes"], 0u);
  EXPECT_EQ(answer["return"][1]["name"], "fine");
  EXPECT_EQ(answer["return"][1]["granularity"], 4096u);
}

TEST_F(ControlTest, AWriteMovesTheGenerationAndCountsWholeGranules) {
  StartOn(NewImage());
  const uint64_t g0 = Generation();
  WriteAt(*image_, kMiB + 10, 100);
  const uint64_t g1 = Generation();
  EXPECT_GT(g1, g0);
  EXPECT_EQ(DirtyBytes(), kGranule);
  WriteAt(*image_, 3 * kMiB - 1, 2);  // two granules
  EXPECT_GT(Generation(), g1);
  EXPECT_EQ(DirtyBytes(), 3 * kGranule);
  // A read moves nothing.
  const uint64_t g2 = Generation();
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(image_->Read(0, buf).ok());
  EXPECT_EQ(Generation(), g2);
}

TEST_F(ControlTest, DirtyBytesStopAtTheDisksEnd) {
  const uint64_t size = kSize + 512;  // the last granule is cut to 512 bytes
  StartOn(NewImage(true, size));
  WriteAt(*image_, size - 1, 1);
  EXPECT_EQ(DirtyBytes(), 512u);
}

// ---- clear-bitmap ----

TEST_F(ControlTest, ClearWithTheCurrentGenerationClearsOnlyThatBitmap) {
  auto image = NewImage();
  ASSERT_TRUE(image);
  ASSERT_TRUE(Add(*image, "other").ok());
  StartOn(image);
  WriteAt(*image_, 5 * kMiB, 4096);
  const Json answer = Ask(ClearRequest("daily", Generation()));
  EXPECT_EQ(answer, (Json{{"return", Json::object()}}));
  EXPECT_EQ(DirtyBytes(), 0u);
  EXPECT_TRUE(AllClear(MustRead(*image_, "daily")));
  EXPECT_EQ(DirtyBytes("other"), kGranule);
  EXPECT_BITS(*image_, "other", Touched(kSize, 16, {{5 * kMiB, 4096}}));
  // And it tracks again from there.
  WriteAt(*image_, 7 * kMiB, 1);
  EXPECT_BITS(*image_, "daily", Touched(kSize, 16, {{7 * kMiB, 1}}));
}

TEST_F(ControlTest, ClearWithAStaleGenerationIsRefusedAndClearsNothing) {
  StartOn(NewImage());
  WriteAt(*image_, 2 * kMiB, 4096);
  const uint64_t stale = Generation();
  WriteAt(*image_, 9 * kMiB, 4096);  // a write the backup may have missed
  const Json answer = Ask(ClearRequest("daily", stale));
  EXPECT_EQ(ClassOf(answer), "BitmapChanged") << answer.dump();
  EXPECT_NE(DescOf(answer).find("daily"), std::string::npos) << answer.dump();
  EXPECT_EQ(DirtyBytes(), 2 * kGranule);
  EXPECT_BITS(*image_, "daily", Touched(kSize, 16, {{2 * kMiB, 4096}, {9 * kMiB, 4096}}));
  // The current generation clears.
  EXPECT_TRUE(Ask(ClearRequest("daily", Generation())).contains("return"));
  EXPECT_EQ(DirtyBytes(), 0u);
}

TEST_F(ControlTest, ClearWithoutAGenerationClearsWhateverChanged) {
  StartOn(NewImage());
  WriteAt(*image_, 0, 1);
  EXPECT_TRUE(Ask(ClearRequest("daily")).contains("return"));
  EXPECT_TRUE(AllClear(MustRead(*image_, "daily")));
}

// ---- malformed requests ----

TEST_F(ControlTest, AnUnknownCommandIsCommandNotFound) {
  StartOn(NewImage());
  const Json answer = Ask(Json{{"execute", "block-dirty-bitmap-clear"}});
  EXPECT_EQ(ClassOf(answer), "CommandNotFound") << answer.dump();
  EXPECT_NE(DescOf(answer).find("block-dirty-bitmap-clear"), std::string::npos);
}

TEST_F(ControlTest, BadRequestsAreGenericErrorsAndChangeNothing) {
  StartOn(NewImage());
  WriteAt(*image_, kMiB, 1);
  const uint64_t g = Generation();
  const std::vector<Json> bad = {
      Json::array(),
      Json("query-bitmaps"),
      Json::object(),
      Json{{"execute", 5}},
      Json{{"arguments", Json::object()}},
      Json{{"execute", "query-bitmaps"}, {"arguments", Json::array()}},
      Json{{"execute", "query-bitmaps"}, {"arguments", {{"export", 5}}}},
      Json{{"execute", "query-bitmaps"}, {"arguments", {{"export", "nosuch"}}}},
      Json{{"execute", "clear-bitmap"}},
      Json{{"execute", "clear-bitmap"}, {"arguments", {{"generation", g}}}},
      Json{{"execute", "clear-bitmap"}, {"arguments", {{"name", 7}}}},
      Json{{"execute", "clear-bitmap"},
           {"arguments", {{"name", "daily"}, {"generation", "1"}}}},
      Json{{"execute", "clear-bitmap"},
           {"arguments", {{"name", "daily"}, {"generation", -1}}}},
      Json{{"execute", "clear-bitmap"},
           {"arguments", {{"name", "daily"}, {"generation", 1.5}}}},
      Json{{"execute", "clear-bitmap"}, {"arguments", {{"name", "nosuch"}}}},
      Json{{"execute", "clear-bitmap"},
           {"arguments", {{"export", "nosuch"}, {"name", "daily"}, {"generation", g}}}},
  };
  for (const Json& request : bad) {
    const Json answer = Ask(request);
    EXPECT_EQ(ClassOf(answer), "GenericError")
        << request.dump() << " -> " << answer.dump();
    EXPECT_FALSE(DescOf(answer).empty()) << request.dump();
  }
  EXPECT_EQ(DirtyBytes(), kGranule);
  EXPECT_EQ(Generation(), g);
}

TEST_F(ControlTest, SeveralExportsNeedTheExportNamed) {
  auto a = NewImage();
  auto b = NewImage();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(Add(*b, "only-b").ok());
  Start({{"a", a}, {"b", b}});
  WriteAt(*a, 0, 1);
  WriteAt(*b, 0, 1);
  const Json answer = Ask(QueryRequest());
  EXPECT_EQ(ClassOf(answer), "GenericError") << answer.dump();
  EXPECT_NE(DescOf(answer).find("export"), std::string::npos) << answer.dump();
  EXPECT_EQ(ClassOf(Ask(ClearRequest("daily"))), "GenericError");

  Json of_b = Ask(Json{{"execute", "query-bitmaps"}, {"arguments", {{"export", "b"}}}});
  ASSERT_TRUE(of_b.contains("return")) << of_b.dump();
  EXPECT_EQ(of_b["return"].size(), 2u) << of_b.dump();
  const Json clear_a{{"execute", "clear-bitmap"},
                     {"arguments", {{"export", "a"}, {"name", "daily"}}}};
  EXPECT_TRUE(Ask(clear_a).contains("return"));
  EXPECT_TRUE(AllClear(MustRead(*a, "daily")));
  EXPECT_FALSE(AllClear(MustRead(*b, "daily")));
}

// ---- bitmaps the server cannot track ----

TEST_F(ControlTest, ADisabledBitmapIsNotTrackedAndCannotBeCleared) {
  auto image = NewImage(/*enabled=*/false);
  ASSERT_TRUE(image);
  ASSERT_TRUE(
      qcow2::MergeIntoBitmap(*image, "daily", Touched(kSize, 16, {{0, 1}}), 16).ok());
  StartOn(image);
  Json e = Entry("daily");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["enabled"], false) << e.dump();
  EXPECT_EQ(e["tracked"], false) << e.dump();
  EXPECT_FALSE(e.contains("generation")) << e.dump();
  for (const Json& request : {ClearRequest("daily"), ClearRequest("daily", 0)}) {
    const Json answer = Ask(request);
    EXPECT_EQ(ClassOf(answer), "GenericError") << answer.dump();
    EXPECT_NE(DescOf(answer).find("disabled"), std::string::npos) << answer.dump();
  }
  EXPECT_BITS(*image_, "daily", Touched(kSize, 16, {{0, 1}}));
}

TEST_F(ControlTest, AReadOnlyImageIsNotTrackedAndCannotBeCleared) {
  MemImage m = CreateMem(Options(kSize, 64 * 1024));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(Add(*m.image, "daily").ok());
  WriteAt(*m.image, 4 * kMiB, 10);
  qcow2::OpenOptions ro;
  ro.read_only = true;
  MemImage r = Reopen(m, ro);
  ASSERT_TRUE(r.image);
  StartOn(std::shared_ptr<qcow2::Image>(std::move(r.image)));
  Json e = Entry("daily");
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["enabled"], true) << e.dump();
  EXPECT_EQ(e["tracked"], false) << e.dump();
  const Json answer = Ask(ClearRequest("daily"));
  EXPECT_EQ(ClassOf(answer), "GenericError") << answer.dump();
  EXPECT_NE(DescOf(answer).find("read-only"), std::string::npos) << answer.dump();
  EXPECT_BITS(*image_, "daily", Touched(kSize, 16, {{4 * kMiB, 10}}));
}

// ---- the socket ----

TEST_F(ControlTest, TheSocketIsPrivateAndAnswersControlCall) {
  StartOn(NewImage());
  struct stat st {};
  ASSERT_EQ(::stat(SocketPath().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  WriteAt(*image_, 6 * kMiB, 1);
  auto list = ControlCall(SocketPath(), QueryRequest());
  ASSERT_TRUE(list.has_value()) << list.status().ToString();
  ASSERT_TRUE(list->is_array() && list->size() == 1) << list->dump();
  EXPECT_EQ((*list)[0]["dirty-bytes"], kGranule);
  const uint64_t stale = (*list)[0]["generation"].get<uint64_t>();

  WriteAt(*image_, 8 * kMiB, 1);
  auto refused = ControlCall(SocketPath(), ClearRequest("daily", stale));
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.status().code(), Code::kBusy) << refused.status().ToString();
  auto unknown = ControlCall(SocketPath(), Json{{"execute", "nosuch"}});
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.status().message().find("unknown command"), std::string::npos)
      << unknown.status().ToString();

  auto cleared = ControlCall(SocketPath(), ClearRequest("daily", Generation()));
  ASSERT_TRUE(cleared.has_value()) << cleared.status().ToString();
  EXPECT_EQ(*cleared, Json::object());
  EXPECT_TRUE(AllClear(MustRead(*image_, "daily")));

  // A line that is not JSON, and two requests on one connection.
  std::vector<std::string> lines = RawExchange(SocketPath(), "{nope\n");
  ASSERT_EQ(lines.size(), 1u);
  const Json not_json = Json::parse(lines[0], nullptr, false);
  EXPECT_EQ(ClassOf(not_json), "GenericError") << lines[0];
  EXPECT_NE(DescOf(not_json).find("not JSON"), std::string::npos) << lines[0];
  const std::string two =
      QueryRequest().dump() + "\n" + Json{{"execute", "x"}}.dump() + "\n";
  lines = RawExchange(SocketPath(), two, 2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(Json::parse(lines[0], nullptr, false).contains("return")) << lines[0];
  EXPECT_EQ(ClassOf(Json::parse(lines[1], nullptr, false)), "CommandNotFound")
      << lines[1];

  server_.reset();
  EXPECT_NE(::access(SocketPath().c_str(), F_OK), 0)
      << "the socket file outlives its server";
}

// A backup takes the generation, copies, then clears with it. A write
// that was marked before the generation was taken but lands its data only
// after the copy read the disk (a slow disk) must not lose its mark: the
// clear is refused, or the bitmap still marks the write once it is done.
TEST_F(ControlTest, AClearDoesNotDropTheMarkOfAWriteStillInFlight) {
  auto m = CreateWrapped<GateStorage>(Options(kSize, 64 * 1024));
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(Add(*m.image, "daily").ok());
  GateStorage* gate = m.wrapper;
  StartOn(std::shared_ptr<qcow2::Image>(std::move(m.image)));
  WriteAt(*image_, 0, 1);  // the mark-ahead region is durable from here on
  ASSERT_TRUE(Ask(ClearRequest("daily")).contains("return"));

  gate->Arm();
  auto writer = std::async(std::launch::async,
                           [&] { return image_->Write(kMiB, Pattern(7, 4096), {}); });
  ASSERT_TRUE(gate->WaitHeld()) << "the write never reached its data";
  // The backup, while the write is in flight: query, (copy), clear.
  auto backup = std::async(std::launch::async, [&] {
    const uint64_t generation = Generation();
    return Ask(ClearRequest("daily", generation));
  });
  const bool answered =
      backup.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  gate->Release();
  ASSERT_TRUE(answered) << "the control server blocked behind a write in flight";
  const Json answer = backup.get();
  const Status written = writer.get();
  ASSERT_TRUE(written.ok()) << written.ToString();

  const bool refused = ClassOf(answer) == "BitmapChanged";
  const BitVector bits = MustRead(*image_, "daily");
  const bool still_marked = bits.size() > (kMiB >> 16) && bits.Test(kMiB >> 16);
  EXPECT_TRUE(refused || still_marked) << "clear-bitmap answered " << answer.dump()
                                       << " while a write was in flight, and once that "
                                          "write was done the bitmap no longer "
                                          "marks it: a backup that copied before the "
                                          "data landed misses the change for good";
}

// `thindisk serve` destroys its ControlServer on SIGTERM before it closes
// the images: a client that connected and says nothing must not hold the
// shutdown (nor the images' close) for the idle limit.
TEST_F(ControlTest, StoppingDoesNotWaitForAnIdleClient) {
  StartOn(NewImage());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, SocketPath().c_str(), SocketPath().size() + 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted by now
  const auto start = std::chrono::steady_clock::now();
  server_.reset();
  const auto waited = std::chrono::steady_clock::now() - start;
  ::close(fd);
  EXPECT_LT(waited, std::chrono::seconds(5))
      << "the server took "
      << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
      << " ms to stop beside a client that sent nothing";
}

TEST_F(ControlTest, StartRefusesAPathThatIsARegularFile) {
  { std::ofstream(SocketPath()) << "keep me\n"; }
  auto image = NewImage();
  ASSERT_TRUE(image);
  auto started = ControlServer::Start(SocketPath(), {{"", image}});
  ASSERT_FALSE(started.has_value());
  EXPECT_EQ(started.status().code(), Code::kInvalidArgument)
      << started.status().ToString();
  EXPECT_NE(started.status().message().find("not a socket"), std::string::npos);
  std::ifstream in(SocketPath());
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep me");
}

TEST_F(ControlTest, StartReplacesAStaleSocket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, SocketPath().c_str(), SocketPath().size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);  // a server that died leaves its socket file behind
  StartOn(NewImage());
  auto list = ControlCall(SocketPath(), QueryRequest());
  ASSERT_TRUE(list.has_value()) << list.status().ToString();
  EXPECT_EQ(list->size(), 1u);
}

TEST_F(ControlTest, ControlCallWithoutAServerFailsNamingThePath) {
  auto r = ControlCall(SocketPath(), QueryRequest());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find(SocketPath()), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace thindisk::cli
