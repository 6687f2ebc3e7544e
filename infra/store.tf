# The nodes' own credentials for a job's checkpoint store (`checkpoint.store: s3://...`): a role
# that may read and write that bucket prefix and nothing else, in an instance profile that orch
# attaches to the nodes of jobs with a store. Made only when `checkpoint_store` is set.

locals {
  store_bucket = var.checkpoint_store == "" ? "" : split("/", trimprefix(var.checkpoint_store, "s3://"))[0]
  store_prefix = var.checkpoint_store == "" ? "" : trim(join("/", slice(split("/", trimprefix(var.checkpoint_store, "s3://")), 1, length(split("/", trimprefix(var.checkpoint_store, "s3://"))))), "/")
  # Objects the nodes may touch: everything under the prefix (the whole bucket without one).
  store_objects = local.store_prefix == "" ? "arn:aws:s3:::${local.store_bucket}/*" : "arn:aws:s3:::${local.store_bucket}/${local.store_prefix}/*"
  with_store    = var.checkpoint_store == "" ? 0 : 1
}

data "aws_iam_policy_document" "node_assume" {
  count = local.with_store

  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "node_store" {
  count = local.with_store

  statement {
    sid       = "CheckpointObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = [local.store_objects]
  }

  statement {
    sid       = "ListTheirPrefix"
    actions   = ["s3:ListBucket"]
    resources = ["arn:aws:s3:::${local.store_bucket}"]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = [local.store_prefix == "" ? "*" : "${local.store_prefix}/*"]
    }
  }
}

resource "aws_iam_role" "node" {
  count = local.with_store

  name               = "${var.name}-node"
  description        = "orch training nodes: read and write ${var.checkpoint_store} only"
  assume_role_policy = data.aws_iam_policy_document.node_assume[0].json

  tags = merge(local.tags, { Name = "${var.name}-node" })
}

resource "aws_iam_role_policy" "node_store" {
  count = local.with_store

  name   = "${var.name}-checkpoint-store"
  role   = aws_iam_role.node[0].id
  policy = data.aws_iam_policy_document.node_store[0].json
}

resource "aws_iam_instance_profile" "node" {
  count = local.with_store

  name = "${var.name}-node"
  role = aws_iam_role.node[0].name

  tags = merge(local.tags, { Name = "${var.name}-node" })
}
