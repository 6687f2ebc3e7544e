# The nodes' own credentials for a job's checkpoint store (`checkpoint.store: s3://...`), made
# only when `checkpoint_store` is set:
# - the policy of each job's own role (`node_job`): objects under <prefix>/<job id>/ only, the
#   job id being the role's `orch-job` tag, and pulls of container images from Amazon ECR. orch
#   makes a role per job with it (attached, and as the permissions boundary, which is the only
#   policy it may attach) when it launches the job's nodes, and deletes it with them
#   (orchestrator/providers/aws/node_roles.py).
# - a role shared by the nodes of kept clusters (whose later jobs are not known when they
#   launch): the whole prefix and ECR pulls, in the instance profile `<name>-node`.
# Both may also read the jobs' bucket data (`data_sources`) and write their outputs
# (`output_destinations`): the statements of policies/node-data*.json.tftpl, added to the
# per-job policy (which is also its role's permissions boundary, so it must hold them) and as
# the shared role's second inline policy, only when a list is not empty.

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

  # s3://bucket[/prefix][/] -> [bucket, prefix]
  data_reads     = [for url in distinct(var.data_sources) : regex("^s3://([^/]+)/?(.*?)/?$", url)]
  output_writes  = [for url in distinct(var.output_destinations) : regex("^s3://([^/]+)/?(.*?)/?$", url)]
  data_objects   = distinct(flatten([for r in local.data_reads : r[1] == "" ? ["arn:aws:s3:::${r[0]}/*"] : ["arn:aws:s3:::${r[0]}/${r[1]}", "arn:aws:s3:::${r[0]}/${r[1]}/*"]]))
  output_objects = distinct([for w in local.output_writes : w[1] == "" ? "arn:aws:s3:::${w[0]}/*" : "arn:aws:s3:::${w[0]}/${w[1]}/*"])
  # One listing statement per bucket, for its sources' prefixes only (a bucket without a
  # prefix: the whole listing).
  data_list_prefixes = { for r in local.data_reads : r[0] => r[1] == "" ? "*" : "${r[1]}/*"... }
  data_statements = concat(
    [for s in jsondecode(templatefile("${path.module}/policies/node-data.json.tftpl", {
      data_objects   = local.data_objects
      output_objects = local.output_objects
    })).Statement : s if length(s.Resource) > 0],
    [for i, bucket in sort(keys(local.data_list_prefixes)) : jsondecode(templatefile("${path.module}/policies/node-data-list.json.tftpl", {
      sid           = "ListDataSources${i}"
      bucket_arn    = "arn:aws:s3:::${bucket}"
      list_prefixes = distinct(local.data_list_prefixes[bucket])
    })).Statement[0]],
  )
  node_job_document = templatefile("${path.module}/policies/node-job.json.tftpl", {
    job_objects      = local.job_objects
    job_list_prefix  = local.job_list_prefix
    store_bucket_arn = "arn:aws:s3:::${local.store_bucket}"
  })
}

resource "aws_iam_policy" "node_job" {
  count = local.with_store

  name        = "${var.name}-node-job"
  description = "orch: one job's nodes read and write <store>/<their role's orch-job tag>/ only"
  # Without data or outputs, the template as it is (the same document as before they existed).
  policy = length(local.data_statements) == 0 ? local.node_job_document : jsonencode({
    Version   = "2012-10-17"
    Statement = concat(jsondecode(local.node_job_document).Statement, local.data_statements)
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

resource "aws_iam_role_policy" "node_data" {
  count = local.with_store == 1 && length(local.data_statements) > 0 ? 1 : 0

  name = "${var.name}-data"
  role = aws_iam_role.node[0].id
  policy = jsonencode({
    Version   = "2012-10-17"
    Statement = local.data_statements
  })
}

resource "aws_iam_instance_profile" "node" {
  count = local.with_store

  name = "${var.name}-node"
  role = aws_iam_role.node[0].name

  tags = merge(local.tags, { Name = "${var.name}-node" })
}
