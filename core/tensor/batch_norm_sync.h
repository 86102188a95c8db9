#pragma once
// BatchNormSync: one member of a group of batch-norm calls, one per device (tower), that
// normalise with statistics over all the members' rows together: synchronised batch norm
// (PyTorch's SyncBatchNorm). The ops (BatchNormOptions::sync, ops.h) exchange a few per-channel
// numbers through it; see Note [Synchronised batch norm] in ops.cc.
//
// Contract:
// - Every member calls all_gather the same number of times with the same counts, in the same
//   order: a group joins replicas of one model, whose batch-norm layers run in the same order
//   forward and backward. Each call blocks until every member has made it.
// - out[i * send.size(), (i + 1) * send.size()) receives member i's send, on every member, so
//   every member can combine the values in the same order and get the same bits.
// - A member that cannot take part (its tower failed) must not leave the others waiting: the
//   owner aborts the group, and every member blocked in or later entering all_gather throws
//   (collectives::CollectiveAborted in tower::BatchNormSyncGroup). A count that differs between
//   members throws InvalidArgument on every member.

#include <span>

namespace towerflow {

class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  virtual int size() const = 0;  // members
  virtual int rank() const = 0;  // this member's index
  // out.size() must be size() * send.size().
  virtual void all_gather(std::span<const double> send, std::span<double> out) = 0;
};

}  // namespace towerflow
