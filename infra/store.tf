# The nodes' own credentials for a job's checkpoint store (`checkpoint.store: s3://...`), made
# only when `checkpoint_store` is set:
# - the policy of each job's own role (`node_job`): objects under <prefix>/<job id>/ only, the
#   job id being the role's `orch-job` tag, and pulls of container images from Amazon ECR. orch
#   makes a role per job with it (attached, and as the permissions boundary, which is the only
#   policy it may attach) when it launches the job's nodes, and deletes it with them
#   (orchestrator/providers/aws/node_roles.py).
# - a role shared by the nodes of kept clusters (whose later jobs are not known when they
#   launch): the whole prefix and ECR pulls, in the instance profile `<name>-node`.

locals {
  store_bucket = var.checkpoint_store == "" ? "" : split("/", trimprefix(var.checkpoint_store, "s3://"))[0]
  store_prefix = var.checkpoint_store == "" ? "" : trim(join("/", slice(split("/", trimprefix(var.checkpoint_store, "s3://")), 1, length(split("/", trimprefix(var.checkpoint_store, "s3://"))))), "/")
  # Objects the nodes may touch: everything under the prefix (the whole bucket without one).
  store_objects = local.store_prefix == "" ? "arn:aws:s3:::${local.store_bucket}/*" : "arn:aws:s3:::${local.store_bucket}/${local.store_prefix}/*"
  with_store    = var.checkpoint_store == "" ? 0 : 1
  # One job's objects, and its listing: the role's orch-job tag names the job ($${...} is an
  # IAM policy variable, written literally).
  job_prefix      = local.store_prefix == "" ? "" : "${local.store_prefix}/"
  job_objects     = "arn:aws:s3:::${local.store_bucket}/${local.job_prefix}$${aws:PrincipalTag/orch-job}/*"
  job_list_prefix = "${local.job_prefix}$${aws:PrincipalTag/orch-job}/*"
}

resource "aws_iam_policy" "node_job" {
  count = local.with_store

  name        = "${var.name}-node-job"
  description = "orch: one job's nodes read and write <store>/<their role's orch-job tag>/ only"
  policy = templatefile("${path.module}/policies/node-job.json.tftpl", {
    job_objects      = local.job_objects
    job_list_prefix  = local.job_list_prefix
    store_bucket_arn = "arn:aws:s3:::${local.store_bucket}"
  })

  tags = merge(local.tags, { Name = "${var.name}-node-job" })
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

  # A job's container image in Amazon ECR: the nodes log in and pull with this role (as the
  # per-job policy of policies/node-job.json.tftpl allows too). Read only, any repository the
  # account can read, as AWS's own read-only ECR policy.
  statement {
    sid       = "PullImagesFromEcr"
    actions   = ["ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    resources = ["*"]
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
