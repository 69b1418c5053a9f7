#include "message_depth.h"

#include <unistd.h>

#include <climits>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/wire_format_lite.h>
#include <onnx/onnx_pb.h>

namespace bnfold {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

std::optional<int> modelMessageDepth(int fd) {
  if (::lseek(fd, 0, SEEK_SET) != 0) return std::nullopt;
  google::protobuf::io::FileInputStream stream(fd, 1 << 20);
  CodedInputStream in(&stream);
  in.SetTotalBytesLimit(INT_MAX);
  struct Level {
    const Descriptor* type;
    CodedInputStream::Limit outerLimit;
  };
  std::vector<Level> open{{onnx::ModelProto::descriptor(), 0}};
  int deepest = 1;
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (open.size() == 1) return in.ConsumedEntireMessage() ? std::optional<int>(deepest) : std::nullopt;
      if (in.BytesUntilLimit() != 0) return std::nullopt;  // a bad tag inside a nested message
      in.PopLimit(open.back().outerLimit);
      open.pop_back();
      continue;
    }
    const int fieldNumber = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* field = open.back().type->FindFieldByNumber(fieldNumber);
    const bool nested = field && field->type() == FieldDescriptor::TYPE_MESSAGE &&
                        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (!nested) {
      if (!WireFormatLite::SkipField(&in, tag)) return std::nullopt;
      continue;
    }
    uint32_t length = 0;
    if (!in.ReadVarint32(&length) || length > static_cast<uint32_t>(INT_MAX)) return std::nullopt;
    open.push_back({field->message_type(), in.PushLimit(static_cast<int>(length))});
    if (static_cast<int>(open.size()) > deepest) deepest = static_cast<int>(open.size());
  }
}

}  // namespace bnfold
