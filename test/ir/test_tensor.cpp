#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "bnfold/error.h"
#include "bnfold/ir/tensor.h"

using namespace bnfold;

namespace {
std::unique_ptr<onnx::TensorProto> protoWithRaw(DataType type, std::vector<int64_t> dims, const void* data,
                                                std::size_t bytes) {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_name("t");
  proto->set_data_type(static_cast<int>(type));
  for (auto d : dims) proto->add_dims(d);
  proto->set_raw_data(std::string(static_cast<const char*>(data), bytes));
  return proto;
}
}  // namespace

TEST_CASE("typed views read float, double, half and bfloat16", "[tensor]") {
  SECTION("float from raw_data") {
    const float values[] = {1.5f, -2.25f, 3.0f};
    Tensor tensor(protoWithRaw(DataType::Float, {3}, values, sizeof(values)));
    auto view = tensor.view<float>();
    REQUIRE(view.size() == 3);
    CHECK(view[1] == -2.25f);
    CHECK(view.map().sum() == Approx(2.25f));
    CHECK(tensor.toDoubles() == std::vector<double>{1.5, -2.25, 3.0});
  }
  SECTION("double from double_data, read in place") {
    auto proto = std::make_unique<onnx::TensorProto>();
    proto->set_data_type(static_cast<int>(DataType::Double));
    proto->add_dims(2);
    proto->add_double_data(0.1);
    proto->add_double_data(-7.0);
    const double* field = proto->double_data().data();
    Tensor tensor(std::move(proto));
    CHECK(tensor.view<double>()[0] == 0.1);
    // No copy: the bytes are the repeated field's own storage.
    CHECK(static_cast<const void*>(tensor.bytes().data()) == static_cast<const void*>(field));
  }
  SECTION("float16 stored as bit patterns in int32_data") {
    auto proto = std::make_unique<onnx::TensorProto>();
    proto->set_data_type(static_cast<int>(DataType::Float16));
    proto->add_dims(3);
    for (float v : {1.0f, -0.5f, 65504.0f}) proto->add_int32_data(Eigen::numext::bit_cast<uint16_t>(Eigen::half(v)));
    Tensor tensor(std::move(proto));
    auto view = tensor.view<Eigen::half>();
    CHECK(static_cast<float>(view[1]) == -0.5f);
    CHECK(tensor.toDoubles() == std::vector<double>{1.0, -0.5, 65504.0});
  }
  SECTION("bfloat16 from raw_data") {
    const Eigen::bfloat16 values[] = {Eigen::bfloat16(2.0f), Eigen::bfloat16(-0.125f)};
    Tensor tensor(protoWithRaw(DataType::BFloat16, {2}, values, sizeof(values)));
    CHECK(tensor.toDoubles() == std::vector<double>{2.0, -0.125});
  }
  SECTION("a view of the wrong type is refused") {
    const float values[] = {1.0f};
    Tensor tensor(protoWithRaw(DataType::Float, {1}, values, sizeof(values)));
    CHECK_THROWS_AS(tensor.view<double>(), std::invalid_argument);
  }
}

TEST_CASE("raw_data at an odd address is read correctly", "[tensor]") {
  // Build raw bytes whose float payload starts one byte in, then trim: the view must not assume alignment.
  std::string bytes(1 + 2 * sizeof(double), '\0');
  const double values[] = {3.25, -1.0};
  std::memcpy(bytes.data() + 1, values, sizeof(values));
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_data_type(static_cast<int>(DataType::Double));
  proto->add_dims(2);
  proto->set_raw_data(bytes.substr(1));
  Tensor tensor(std::move(proto));
  CHECK(tensor.view<double>().map()(0) == 3.25);
  CHECK(tensor.toDoubles()[1] == -1.0);
}

TEST_CASE("fromDoubles rounds once to the tensor's type", "[tensor]") {
  // 1 + 2^-11 + 2^-30 lies just above the midpoint between two halves (1 and 1 + 2^-10): correct rounding
  // goes up. Rounding to float first (to nearest) would give exactly the midpoint, then round to even (down).
  const double justAboveMidpoint = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  Tensor half = Tensor::fromDoubles("h", DataType::Float16, {1}, {justAboveMidpoint});
  CHECK(half.toDoubles()[0] == 1.0 + std::ldexp(1.0, -10));
  Tensor f = Tensor::fromDoubles("f", DataType::Float, {2}, {0.1, 1e-40});
  CHECK(f.view<float>()[0] == 0.1f);
  CHECK(f.dims() == std::vector<int64_t>{2});
  Tensor bf = Tensor::fromDoubles("b", DataType::BFloat16, {1}, {1.0 + std::ldexp(1.0, -8)});
  CHECK(bf.toDoubles()[0] == 1.0);  // a tie rounds to even
  Tensor halfTie = Tensor::fromDoubles("t", DataType::Float16, {2}, {1.0 + std::ldexp(1.0, -11), -0.0});
  CHECK(halfTie.toDoubles()[0] == 1.0);
  CHECK(std::signbit(halfTie.toDoubles()[1]));
  CHECK_THROWS_AS(Tensor::fromDoubles("i", DataType::Int64, {1}, {1.0}), std::invalid_argument);
}

TEST_CASE("validate catches size mismatches", "[tensor]") {
  const float values[] = {1.0f, 2.0f, 3.0f};
  Tensor tooFew(protoWithRaw(DataType::Float, {4}, values, sizeof(values)));
  CHECK_THROWS_WITH(tooFew.validate("m.onnx"), Catch::Contains("m.onnx") && Catch::Contains("12 bytes") &&
                                                   Catch::Contains("need 16"));
  Tensor exact(protoWithRaw(DataType::Float, {3}, values, sizeof(values)));
  CHECK_NOTHROW(exact.validate("m.onnx"));
  auto typed = std::make_unique<onnx::TensorProto>();
  typed->set_data_type(static_cast<int>(DataType::Float));
  typed->add_dims(2);
  typed->add_float_data(1.0f);
  Tensor typedShort(std::move(typed));
  CHECK_THROWS_AS(typedShort.validate("m.onnx"), bnfold::Error);
}

TEST_CASE("integer tensors convert to int64 and double", "[tensor]") {
  const int8_t values[] = {-3, 7};
  Tensor tensor(protoWithRaw(DataType::Int8, {2}, values, sizeof(values)));
  CHECK(tensor.toInt64s() == std::vector<int64_t>{-3, 7});
  CHECK(tensor.toDoubles() == std::vector<double>{-3.0, 7.0});
  Tensor shape = Tensor::fromInt64s("s", {3}, {1, -1, 4});
  CHECK(shape.view<int64_t>()[1] == -1);
}

TEST_CASE("byteSource hands larger raw_data over instead of copying it", "[tensor]") {
  std::vector<float> values(64);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i) - 3.0f;
  Tensor tensor(protoWithRaw(DataType::Float, {64}, values.data(), values.size() * sizeof(float)));
  const std::string_view before = tensor.bytes();
  REQUIRE(tensor.deferredRawData() == nullptr);

  const auto source = tensor.byteSource();
  REQUIRE(source->size() == static_cast<int64_t>(values.size() * sizeof(float)));
  std::vector<float> read(values.size());
  source->read(0, source->size(), reinterpret_cast<char*>(read.data()));
  CHECK(read == values);
  // One buffer for both: the tensor reads the source, and a view taken before still sees the bytes.
  CHECK(tensor.deferredRawData() == source.get());
  CHECK(tensor.bytes().data() == before.data());
  CHECK(std::memcmp(before.data(), values.data(), before.size()) == 0);
  CHECK(tensor.toDoubles()[5] == -0.5);
  CHECK_NOTHROW(tensor.validate("model.onnx"));
  // Asked again, it shares the same source.
  CHECK(tensor.byteSource() == source);
  // Put back into the proto, the bytes are the same and the source stays readable.
  tensor.materialize();
  CHECK(tensor.deferredRawData() == nullptr);
  CHECK(tensor.proto().raw_data() == std::string(reinterpret_cast<const char*>(values.data()), before.size()));
  source->read(0, source->size(), reinterpret_cast<char*>(read.data()));
  CHECK(read == values);
}

TEST_CASE("bytes follow the proto's raw_data through materialize and a lent proto", "[tensor]") {
  const float values[] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f,
                          15.0f, 16.0f, 17.0f, 18.0f, 19.0f, 20.0f};
  Tensor tensor(protoWithRaw(DataType::Float, {20}, values, sizeof(values)));
  CHECK(tensor.elementCount() == 20);
  CHECK(tensor.bytes().data() == tensor.proto().raw_data().data());

  // Handed over to a source and put back: read from the proto's new string.
  tensor.byteSource();
  tensor.materialize();
  CHECK(tensor.bytes().data() == tensor.proto().raw_data().data());
  CHECK(tensor.toDoubles()[19] == 20.0);

  // A proto whose bytes changed while it was lent (its type and dims never change): the tensor reads the bytes it
  // gets back, not the old ones. The new string is longer, so it cannot reuse the old buffer.
  std::unique_ptr<onnx::TensorProto> lent = tensor.lendProto();
  std::vector<float> more(40, 0.5f);
  lent->set_raw_data(std::string(reinterpret_cast<const char*>(more.data()), more.size() * sizeof(float)));
  tensor.returnProto(std::move(lent));
  CHECK(tensor.bytes().size() == 20 * sizeof(float) * 2);
  CHECK(tensor.bytes().data() == tensor.proto().raw_data().data());
}

TEST_CASE("an element count that overflows is refused when asked for", "[tensor]") {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_name("huge");
  proto->set_data_type(static_cast<int>(DataType::Float));
  for (int i = 0; i < 4; ++i) proto->add_dims(int64_t{1} << 20);
  Tensor tensor(std::move(proto));
  CHECK(tensor.dataType() == DataType::Float);
  CHECK_THROWS_WITH(tensor.elementCount(), Catch::Contains("huge") && Catch::Contains("does not fit in 64 bits"));
}

TEST_CASE("byteSource copies short raw_data and typed fields", "[tensor]") {
  SECTION("raw_data of a few bytes") {
    const float values[] = {1.0f, 2.0f};
    Tensor tensor(protoWithRaw(DataType::Float, {2}, values, sizeof(values)));
    const std::string_view before = tensor.bytes();
    const auto source = tensor.byteSource();
    CHECK(tensor.deferredRawData() == nullptr);
    CHECK(tensor.bytes().data() == before.data());
    float read[2];
    source->read(0, sizeof(read), reinterpret_cast<char*>(read));
    CHECK(read[1] == 2.0f);
  }
  SECTION("float_data") {
    auto proto = std::make_unique<onnx::TensorProto>();
    proto->set_data_type(static_cast<int>(DataType::Float));
    proto->add_dims(32);
    for (int i = 0; i < 32; ++i) proto->add_float_data(static_cast<float>(i));
    Tensor tensor(std::move(proto));
    const auto source = tensor.byteSource();
    CHECK(tensor.deferredRawData() == nullptr);
    CHECK(tensor.proto().float_data_size() == 32);
    float last = 0;
    source->read(31 * 4, 4, reinterpret_cast<char*>(&last));
    CHECK(last == 31.0f);
  }
}
